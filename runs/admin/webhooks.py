"""Webhooks in the operations console: a tenant's endpoints (URL, event types, enabled), every delivery, and
the receivers paused for not answering (with why and since when, and the action that resumes them).

Operators see each attempt's whole error here; tenants see only its kind
(``DeliveryFailure``) on the run page.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, TypedDict

from django import forms
from django.contrib import admin, messages
from django.db.models import OuterRef, Subquery
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from runs.admin.common import EstimatedCountPaginator, operator, timestamp_column
from runs.exceptions import InvalidTransition
from runs.models import (
    WEBHOOK_EVENT_TYPES,
    ReceiverOf,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookReceiver,
)
from runs.webhooks import deliveries, receivers, targets

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


class ReceiverHealth(TypedDict):
    """What ``WebhookEndpointAdmin.get_queryset`` annotates each endpoint with: its receiver's health."""

    receiver_id: int | None
    paused_at: datetime | None
    paused_reason: str | None


class WebhookEndpointForm(forms.ModelForm):
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in WEBHOOK_EVENT_TYPES],
        widget=forms.CheckboxSelectMultiple,
        initial=list(WEBHOOK_EVENT_TYPES),
    )

    class Meta:
        model = WebhookEndpoint
        fields = ("tenant", "url", "event_types", "enabled", "description")

    def clean_url(self) -> str:
        url = self.cleaned_data["url"]
        try:
            targets.check_url(url)
        except targets.Refused as exc:
            raise forms.ValidationError(f"This URL can never be delivered to: {exc}") from None
        return url


def paused_text(paused_at: datetime | None, reason: str | None) -> str:
    return (
        f"paused since {timezone.localtime(paused_at):%Y-%m-%d %H:%M:%S}: {reason}"
        if paused_at
        else ""
    )


def resume_message(admin_: admin.ModelAdmin, request, resumed: int, due: int) -> None:
    if resumed:
        admin_.message_user(
            request,
            f"{resumed} receiver(s) resumed; {due} waiting delivery(ies) are due now.",
            messages.SUCCESS,
        )
    else:
        admin_.message_user(request, "None of the selected receivers was paused.", messages.WARNING)


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("url", "tenant", "types", "enabled", "paused", "created")
    list_filter = ("enabled", "tenant")
    search_fields = ("url", "description")
    list_select_related = ("tenant",)
    actions = ("resume",)

    created = timestamp_column("created_at", "created")

    def get_queryset(self, request):
        # Paused or not is the receiver's (its scheme, host and port), shared with the tenant's other URLs there.
        health = WebhookReceiver.objects.filter(
            tenant=OuterRef("tenant"), receiver=ReceiverOf(OuterRef("url")), paused_at__isnull=False
        )
        return (
            super()
            .get_queryset(request)
            .annotate(
                receiver_id=Subquery(health.values("pk")[:1]),
                paused_at=Subquery(health.values("paused_at")[:1]),
                paused_reason=Subquery(health.values("paused_reason")[:1]),
            )
        )

    @admin.display(description="event types")
    def types(self, endpoint: WebhookEndpoint) -> str:
        return ", ".join(endpoint.event_types)

    @admin.display(description="paused", ordering="paused_at")
    def paused(self, endpoint: WithAnnotations[WebhookEndpoint, ReceiverHealth]) -> str:
        return paused_text(endpoint.paused_at, endpoint.paused_reason)

    @admin.action(
        description="Resume the selected endpoints' paused receivers", permissions=["change"]
    )
    def resume(self, request, queryset) -> None:
        ids = [e.receiver_id for e in queryset[:500] if e.receiver_id is not None]
        resume_message(self, request, *receivers.resume(ids=ids, actor=operator(request)))


class PausedFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "paused"

    def lookups(self, request, model_admin):
        return [("yes", "paused"), ("no", "not paused")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(paused_at__isnull=self.value() == "no")
        return queryset


@admin.register(WebhookReceiver)
class WebhookReceiverAdmin(admin.ModelAdmin):
    """A tenant's receivers that failed to answer lately; the paused ones first."""

    list_display = ("receiver", "tenant", "state", "silent_attempts", "last_failure", "resumed")
    list_filter = (PausedFilter, "tenant")
    search_fields = ("receiver",)
    list_select_related = ("tenant",)
    actions = ("resume",)
    readonly_fields = (
        "tenant",
        "receiver",
        "state",
        "silent_attempts",
        "last_error",
        "last_failure",
        "resumed",
        "resumed_by",
    )
    fields = readonly_fields

    last_failure = timestamp_column("last_failure_at", "last failure")
    resumed = timestamp_column("resumed_at", "resumed")

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # a paused receiver's deliveries are parked until it is resumed

    @admin.display(description="state", ordering="paused_at")
    def state(self, health: WebhookReceiver) -> str:
        return paused_text(health.paused_at, health.paused_reason) or "active"

    @admin.action(
        description="Resume the selected receivers (their waiting deliveries are due at once)",
        permissions=["change"],
    )
    def resume(self, request, queryset) -> None:
        ids = list(queryset.values_list("pk", flat=True)[:500])
        resume_message(self, request, *receivers.resume(ids=ids, actor=operator(request)))


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "event_type",
        "run_link",
        "status_column",
        "url",
        "short_error",
        "next_attempt",
        "created",
    )
    list_filter = ("status", "event_type")
    search_fields = ("=webhook_id", "=run__id", "url")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = ("redeliver",)
    readonly_fields = (
        "event",
        "run",
        "tenant",
        "endpoint",
        "url",
        "event_type",
        "webhook_id",
        "status",
        "attempts",
        "next_attempt",
        "last_attempt",
        "response_code",
        "response_body",
        "last_error",
        "failure",
        "created",
        "delivered",
    )
    raw_id_fields = ("event", "run", "endpoint")

    next_attempt = timestamp_column("next_attempt_at", "next attempt")
    last_attempt = timestamp_column("last_attempt_at", "last attempt")
    created = timestamp_column("created_at", "created")
    delivered = timestamp_column("delivered_at", "delivered")

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="status", ordering="status")
    def status_column(self, delivery: WebhookDelivery) -> str:
        attempts = "1 attempt" if delivery.attempts == 1 else f"{delivery.attempts} attempts"
        return f"{delivery.get_status_display()}, {attempts}"

    @admin.display(description="last answer")
    def short_error(self, delivery: WebhookDelivery) -> str:
        error = (
            (delivery.last_error[:80] + "…")
            if len(delivery.last_error) > 80
            else delivery.last_error
        )
        if delivery.response_code is None:
            return error
        return (
            f"HTTP {delivery.response_code}: {error}" if error else f"HTTP {delivery.response_code}"
        )

    @admin.display(description="run")
    def run_link(self, delivery: WebhookDelivery):
        url = reverse("admin:runs_run_change", args=[delivery.run_id])
        return format_html('<a href="{}">{}</a>', url, str(delivery.run_id)[:8])

    @admin.action(
        description="Redeliver the selected deliveries (delivered or dead)", permissions=["change"]
    )
    def redeliver(self, request, queryset) -> None:
        sent, refused = 0, []
        for delivery in queryset[:500]:
            try:
                deliveries.redeliver(delivery=delivery, actor=operator(request))
                sent += 1
            except InvalidTransition as exc:
                refused.append(f"#{delivery.pk}: {exc}")
        if sent:
            self.message_user(request, f"{sent} redelivery(ies) queued.", messages.SUCCESS)
        for line in refused[:10]:
            self.message_user(request, line, messages.WARNING)
