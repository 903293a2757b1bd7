"""Schedules in the operations console: what fires when, what it made and missed; enable, disable, change."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.utils import timezone

from runs.admin.common import timestamp_column
from runs.exceptions import InvalidRunInput
from runs.models import Schedule
from runs.schedules import arm, check_cadence


class ScheduleForm(forms.ModelForm):
    class Meta:
        model = Schedule
        fields = (
            "tenant",
            "name",
            "kind",
            "input",
            "cron",
            "every_seconds",
            "timezone",
            "overlap",
            "catch_up",
            "enabled",
        )

    def clean(self):
        super().clean()
        data = self.cleaned_data
        try:
            cadence = check_cadence(
                cron=data.get("cron"),
                every_seconds=data.get("every_seconds"),
                timezone=data.get("timezone"),
            )
        except InvalidRunInput as exc:
            raise forms.ValidationError(str(exc)) from None
        data["cron"], data["every_seconds"] = cadence.cron, cadence.every_seconds
        return data


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    list_display = (
        "__str__",
        "tenant",
        "kind",
        "enabled",
        "next_fire",
        "last_fired",
        "fires",
        "missed",
        "overlap",
        "catch_up",
    )
    list_filter = ("enabled", "overlap", "catch_up", "kind")
    list_select_related = ("tenant",)
    search_fields = ("=id", "name", "kind")
    ordering = ("next_fire_at", "id")
    readonly_fields = ("next_fire_at", "last_fired_at", "fires", "missed", "last_error")
    actions = ("enable", "disable")

    next_fire = timestamp_column("next_fire_at", "next fire")
    last_fired = timestamp_column("last_fired_at", "last fired")

    def save_model(self, request, obj, form, change) -> None:
        obj.updated_at = timezone.now()
        arm(obj)
        super().save_model(request, obj, form, change)

    @admin.action(description="Enable (next fire time from now)", permissions=["change"])
    def enable(self, request, queryset):
        for schedule in queryset:
            schedule.enabled = True
            arm(schedule)
            schedule.save(update_fields=["enabled", "next_fire_at"])
        self.message_user(request, f"Enabled {queryset.count()} schedule(s).")

    @admin.action(description="Disable", permissions=["change"])
    def disable(self, request, queryset):
        n = queryset.update(enabled=False, next_fire_at=None)
        self.message_user(request, f"Disabled {n} schedule(s).")
