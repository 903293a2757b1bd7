"""Webhooks in the operations console: a tenant's endpoints (URL, event types, enabled) and every delivery."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html

from runs.admin.common import EstimatedCountPaginator, operator, timestamp_column
from runs.exceptions import InvalidTransition
from runs.models import WEBHOOK_EVENT_TYPES, WebhookDelivery, WebhookEndpoint
from runs.webhooks import deliveries, targets


class WebhookEndpointForm(forms.ModelForm):
    event_types = forms.MultipleChoiceField(
        choices=[(t, t) for t in WEBHOOK_EVENT_TYPES], widget=forms.CheckboxSelectMultiple,
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


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    form = WebhookEndpointForm
    list_display = ("url", "tenant", "types", "enabled", "created")
    list_filter = ("enabled", "tenant")
    search_fields = ("url", "description")
    list_select_related = ("tenant",)

    created = timestamp_column("created_at", "created")

    @admin.display(description="event types")
    def types(self, endpoint: WebhookEndpoint) -> str:
        return ", ".join(endpoint.event_types)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("id", "event_type", "run_link", "status_column", "url", "short_error", "next_attempt", "created")
    list_filter = ("status", "event_type")
    search_fields = ("=webhook_id", "=run__id", "url")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    actions = ("redeliver",)
    readonly_fields = ("event", "run", "tenant", "endpoint", "url", "event_type", "webhook_id", "status", "attempts",
                       "next_attempt", "last_attempt", "response_code", "response_body", "last_error",
                       "created", "delivered")
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
        error = (delivery.last_error[:80] + "…") if len(delivery.last_error) > 80 else delivery.last_error
        if delivery.response_code is None:
            return error
        return f"HTTP {delivery.response_code}: {error}" if error else f"HTTP {delivery.response_code}"

    @admin.display(description="run")
    def run_link(self, delivery: WebhookDelivery):
        url = reverse("admin:runs_run_change", args=[delivery.run_id])
        return format_html('<a href="{}">{}</a>', url, str(delivery.run_id)[:8])

    @admin.action(description="Redeliver the selected deliveries (delivered or dead)", permissions=["change"])
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
