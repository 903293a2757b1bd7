"""Tenants (limits and usage now), their API keys (the secret shown once) and memberships."""

from __future__ import annotations

from datetime import UTC

from django import forms
from django.contrib import admin
from django.db.models import DecimalField, OuterRef, Subquery, Value
from django.db.models.functions import Coalesce
from django.template.response import TemplateResponse
from django.utils import timezone

from runs import kinds, operations
from runs.admin.common import money, money_column, operator, timestamp_column
from runs.keys import ALL_SCOPES, create_api_key
from runs.models import MONEY, ApiKey, Membership, Tenant, TenantDailyCost

TENANT_EDITABLE = (
    "name",
    "slug",
    "max_running",
    "max_queued",
    "weight",
    "default_cost_ceiling_cents",
    "daily_cost_cap_cents",
    "allowed_kinds",
)


class AllowedKindsField(forms.CharField):
    """Kind names separated by commas; blank lifts the list (``None``: every public kind)."""

    def prepare_value(self, value):
        return ", ".join(value) if isinstance(value, list | tuple) else value

    def to_python(self, value):
        names = list(
            dict.fromkeys(
                n.strip() for n in (super().to_python(value) or "").split(",") if n.strip()
            )
        )
        return names or None

    def validate(self, value):
        super().validate(value)
        try:
            kinds.allowable(value)
        except kinds.NotStartable as exc:
            raise forms.ValidationError(f"{str(exc)[:1].upper()}{str(exc)[1:]}.") from None


class TenantForm(forms.ModelForm):
    allowed_kinds = AllowedKindsField(
        required=False,
        label="Kinds it may start",
        help_text="Kind names separated by commas; blank: every kind (task kinds and kinds registered with "
        "public=False never). `manage.py allowkinds` sets it too.",
        widget=forms.TextInput(attrs={"size": 80}),
    )

    class Meta:
        model = Tenant
        fields = ("allowed_kinds",)  # the admin adds the fieldsets' fields


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    form = TenantForm
    list_display = (
        "slug",
        "name",
        "paused",
        "running_now",
        "queued_now",
        "cost_today",
        "daily_cap",
    )
    list_filter = ("paused",)
    search_fields = ("slug", "name")
    ordering = ("slug",)
    actions = ("pause_tenants", "resume_tenants")
    fieldsets = (
        (None, {"fields": ("name", "slug", "paused")}),
        (
            "Limits",
            {
                "fields": (
                    "max_running",
                    "max_queued",
                    "weight",
                    "default_cost_ceiling_cents",
                    "daily_cost_cap_cents",
                )
            },
        ),
        ("Kinds", {"fields": ("allowed_kinds",)}),
        ("Usage now", {"fields": ("running", "queued", "cost_today", "created")}),
    )
    readonly_fields = ("paused", "running", "queued", "cost_today", "created")

    def get_queryset(self, request):
        today = timezone.now().astimezone(UTC).date()  # the day the checkpoints add to (UTC)
        spent = TenantDailyCost.objects.filter(tenant=OuterRef("pk"), day=today).values(
            "cost_cents"
        )[:1]
        return (
            super()
            .get_queryset(request)
            .annotate(
                spent_today=Coalesce(Subquery(spent), Value(0), output_field=DecimalField(**MONEY))
            )
        )

    def save_model(self, request, obj, form, change) -> None:
        if not change:
            obj.save()
            return
        # Never a full save: `running` and `queued` are live counters the claim changes meanwhile.
        fields = [name for name in form.changed_data if name in TENANT_EDITABLE]
        if fields:
            obj.save(update_fields=fields)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a tenant's runs, steps and events would go in one giant cascade; pause it instead

    @admin.display(description="running / max")
    def running_now(self, tenant: Tenant) -> str:
        return f"{tenant.running} / {tenant.max_running}"

    @admin.display(description="queued / max")
    def queued_now(self, tenant: Tenant) -> str:
        return f"{tenant.queued} / {tenant.max_queued}"

    @admin.display(description="cost today (UTC)", ordering="spent_today")
    def cost_today(self, tenant: Tenant) -> str:
        return money(getattr(tenant, "spent_today", None))

    daily_cap = money_column("daily_cost_cap_cents", "daily cap")
    created = timestamp_column("created_at", "created")

    @admin.action(description="Pause: workers stop claiming its runs", permissions=["change"])
    def pause_tenants(self, request, queryset):
        self._set_paused(request, queryset, paused=True)

    @admin.action(description="Resume", permissions=["change"])
    def resume_tenants(self, request, queryset):
        self._set_paused(request, queryset, paused=False)

    def _set_paused(self, request, queryset, *, paused: bool) -> None:
        tenants = list(queryset)
        for tenant in tenants:
            operations.set_tenant_paused(tenant=tenant, paused=paused, actor=operator(request))
        verb = "Paused" if paused else "Resumed"
        self.message_user(request, f"{verb}: {', '.join(t.slug for t in tenants)}.")


class ApiKeyAddForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiKey.Scope.choices, initial=ALL_SCOPES, widget=forms.CheckboxSelectMultiple
    )

    class Meta:
        model = ApiKey
        fields = ("tenant", "name", "scopes")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "tenant", "prefix", "scope_list", "created", "last_used", "revoked")
    list_filter = ("revoked_at", "tenant")
    list_select_related = ("tenant",)
    search_fields = ("name", "prefix__exact", "tenant__slug")
    autocomplete_fields = ("tenant",)
    actions = ("revoke",)

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = ApiKeyAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant", "name", "scopes")
        return ("name", "tenant", "prefix", "scope_list", "created", "last_used", "revoked")

    def get_readonly_fields(self, request, obj=None):
        return (
            ()
            if obj is None
            else ("tenant", "prefix", "scope_list", "created", "last_used", "revoked")
        )

    created = timestamp_column("created_at", "created")
    last_used = timestamp_column("last_used_at", "last used")
    revoked = timestamp_column("revoked_at", "revoked")

    def save_model(self, request, obj, form, change) -> None:
        if change:
            if "name" in form.changed_data:
                obj.save(update_fields=["name"])  # last_used_at is written concurrently by the API
            return
        issued = create_api_key(
            tenant=obj.tenant, name=obj.name, scopes=form.cleaned_data["scopes"]
        )
        obj.pk, obj.prefix, obj.secret_sha256 = (
            issued.api_key.pk,
            issued.api_key.prefix,
            issued.api_key.secret_sha256,
        )
        obj.created_at = issued.api_key.created_at
        obj.issued_secret = issued.secret  # shown on the next page only; never stored

    def response_add(self, request, obj, post_url_continue=None):
        context = {
            **self.admin_site.each_context(request),
            "title": "API key created",
            "opts": self.opts,
            "api_key": obj,
            "secret": obj.issued_secret,
        }
        response = TemplateResponse(request, "admin/runs/apikey/secret.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.display(description="scopes")
    def scope_list(self, api_key: ApiKey) -> str:
        return ", ".join(api_key.scopes)

    @admin.action(description="Revoke: the key stops working at once", permissions=["change"])
    def revoke(self, request, queryset):
        # One guarded UPDATE; a key already revoked keeps its original time.
        count = queryset.filter(revoked_at__isnull=True).update(revoked_at=timezone.now())
        self.message_user(request, f"Revoked {count} key{'s' if count != 1 else ''}.")


# What each role may do, said where a role is chosen (the dashboard's and the API's checks enforce it).
ROLE_CHOICES = [
    (Membership.Role.VIEWER, "Viewer: reads the tenant's runs, steps and results"),
    (
        Membership.Role.OPERATOR,
        "Operator: also submits, cancels, pauses, resumes, retries and sends messages",
    ),
    (Membership.Role.APPROVER, "Approver: also approves, rejects and resolves"),
]


class MembershipForm(forms.ModelForm):
    # In the form, not the model: the descriptions are words for people, not schema.
    role = forms.ChoiceField(
        choices=ROLE_CHOICES,
        initial=Membership.Role.VIEWER,
        widget=forms.RadioSelect,
        help_text="Each role can do everything the one above it can.",
    )

    class Meta:
        model = Membership
        fields = ("user", "tenant", "role")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    form = MembershipForm
    list_display = ("user", "tenant", "role")
    list_filter = ("role", "tenant")
    list_select_related = ("user", "tenant")
    search_fields = ("user__username", "tenant__slug")
    autocomplete_fields = ("user", "tenant")
