"""Runs and steps in the admin, built to stay fast on a run table of millions of rows.

No exact count(*) (the planner's estimate paginates), filters whose choices
come from the registry and small tables rather than SELECT DISTINCT over
runs, one query for the page with its tenants, and a change page read
entirely from the engine's rows: people act on runs through the actions,
which call the services, never by saving the row.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib import admin
from django.contrib.admin import ActionLocation
from django.db.models import Q
from django.urls import path, reverse
from django.utils.html import format_html

from runs import selectors
from runs.admin import run_actions
from runs.admin.common import EstimatedCountPaginator, ReadOnlyInline, json_block
from runs.admin.overview import overview_view
from runs.models import Event, Queue, Run, Step
from runs.registry import all_kinds

EVENTS_SHOWN = 200


class KindFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "kind"

    def lookups(self, request, model_admin):
        return [(name, name) for name in sorted(kind.name for kind in all_kinds())]

    def queryset(self, request, queryset):
        return queryset.filter(kind=self.value()) if self.value() else queryset


class QueueFilter(admin.SimpleListFilter):
    title = "queue"
    parameter_name = "queue"

    def lookups(self, request, model_admin):
        names = set(settings.RUNS_QUEUES) | {kind.queue for kind in all_kinds()}
        names |= set(Queue.objects.values_list("name", flat=True))
        return [(name, name) for name in sorted(names)]

    def queryset(self, request, queryset):
        return queryset.filter(queue=self.value()) if self.value() else queryset


class StepInline(ReadOnlyInline):
    model = Step
    fields = ("generation", "seq", "name", "kind", "status", "executions", "tokens_in", "tokens_out",
              "cost_cents", "started_at", "ended_at", "error")
    readonly_fields = fields
    ordering = ("generation", "seq")
    show_change_link = True


class EventInline(ReadOnlyInline):
    model = Event
    fields = ("seq", "type", "actor_type", "actor_id", "payload", "created_at")
    readonly_fields = fields
    ordering = ("seq",)
    verbose_name_plural = f"events (the latest {EVENTS_SHOWN})"


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("short_id", "kind", "tenant", "queue", "status", "error_kind", "progress", "attempt",
                    "cost_cents", "created_at", "finished_at")
    list_filter = ("status", KindFilter, QueueFilter, "tenant", "error_kind", "created_at")
    list_select_related = ("tenant",)
    search_fields = ("id__exact", "idempotency_key__exact")
    search_help_text = "A run id or an idempotency key (exact)."
    ordering = ("-created_at", "-id")
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    raw_id_fields = ("tenant", "parent")
    inlines = (StepInline, EventInline)
    actions = (
        run_actions.cancel_runs, run_actions.retry_runs, run_actions.retry_from_step, run_actions.fork_from_step,
        run_actions.requeue_stuck_runs, run_actions.approve_runs, run_actions.reject_runs,
        run_actions.resolve_runs,
    )
    fieldsets = (
        (None, {"fields": ("id", "tenant", "kind", "kind_version", "queue", "priority", "status", "waiting_for",
                           "error_kind", "error", "parent", "children_pending", "origin", "origin_step")}),
        ("Progress", {"fields": ("current_step", "steps_done", "steps_total", "generation", "attempt", "failures",
                                 "max_attempts", "cost_cents", "cost_ceiling_cents", "running_seconds",
                                 "deadline_seconds")}),
        ("Data", {"fields": ("input_json", "result_json", "idempotency_key", "callback_url")}),
        ("Lease (written by the worker)", {"classes": ("collapse",), "fields": (
            "lease_token", "locked_by", "locked_until", "claimed_at", "heartbeat_at", "last_event_seq")}),
        ("Times", {"fields": ("created_at", "run_after", "started_at", "finished_at", "expires_at", "updated_at",
                              "cancel_requested_at", "pause_requested_at")}),
    )

    def get_readonly_fields(self, request, obj=None):
        # Every field: the worker owns the row, people change it only through the actions.
        return [name for fieldset in self.fieldsets for name in fieldset[1]["fields"]]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("tenant")

    def get_urls(self):
        view = self.admin_site.admin_view(overview_view(self.admin_site))
        return [path("overview/", view, name="runs_overview"), *super().get_urls()]

    def get_actions(self, request, action_location=ActionLocation.CHANGE_LIST):
        actions = super().get_actions(request, action_location=action_location)
        actions.pop("delete_selected", None)
        return actions

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        match = Q(idempotency_key=term)
        try:
            match |= Q(id=uuid.UUID(term))
        except ValueError:
            pass
        return queryset.filter(match), False

    def get_formset_kwargs(self, request, obj, inline, prefix):
        kwargs = super().get_formset_kwargs(request, obj, inline, prefix)
        if isinstance(inline, EventInline) and obj is not None:
            # A long run has thousands of events; the page shows the latest, by the (run, seq) index.
            kwargs["queryset"] = kwargs["queryset"].filter(seq__gt=obj.last_event_seq - EVENTS_SHOWN)
        return kwargs

    # Nobody adds, edits or deletes runs here: submits go through the API, changes through the actions.
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_cancel_permission(self, request) -> bool:
        return request.user.has_perm("runs.cancel_run")

    def has_retry_permission(self, request) -> bool:
        return request.user.has_perm("runs.retry_run")

    def has_requeue_permission(self, request) -> bool:
        return request.user.has_perm("runs.requeue_run")

    def has_approve_permission(self, request) -> bool:
        return request.user.has_perm("runs.approve_run")

    def has_resolve_permission(self, request) -> bool:
        return request.user.has_perm("runs.resolve_run")

    @admin.display(description="run", ordering="id")
    def short_id(self, run: Run) -> str:
        return str(run.pk)[:8]

    @admin.display(description="steps")
    def progress(self, run: Run) -> str:
        return f"{run.steps_done} / {run.steps_total}" if run.steps_total else str(run.steps_done)

    @admin.display(description="input")
    def input_json(self, run: Run):
        return json_block(run.input)

    @admin.display(description="result")
    def result_json(self, run: Run):
        return json_block(run.result)

    @admin.display(description="waiting for")
    def waiting_for(self, run: Run):
        waiting = selectors.waiting_for(run)
        return json_block(waiting) if waiting else "—"


@admin.register(Step)
class StepAdmin(admin.ModelAdmin):
    list_display = ("__str__", "run_link", "generation", "seq", "name", "kind", "status", "tokens_in",
                    "tokens_out", "cost_cents", "started_at", "ended_at")
    list_filter = ("status", "kind")
    search_fields = ("run__id__exact",)
    search_help_text = "A run id (exact)."
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    raw_id_fields = ("run",)
    fields = ("run", "generation", "seq", "name", "kind", "status", "executions", "idempotency_key", "tokens_in",
              "tokens_out", "cost_cents", "started_at", "ended_at", "error", "input_json", "output_json")
    readonly_fields = fields

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="run")
    def run_link(self, step: Step):
        url = reverse("admin:runs_run_change", args=[step.run_id])
        return format_html('<a href="{}">{}</a>', url, str(step.run_id)[:8])

    @admin.display(description="input")
    def input_json(self, step: Step):
        return json_block(step.input)

    @admin.display(description="output")
    def output_json(self, step: Step):
        return json_block(step.output)
