"""Runs and steps in the admin, built to stay fast on a run table of millions of rows.

No exact count(*) (the planner's estimate paginates), filters whose choices
come from the registry and small tables rather than SELECT DISTINCT over
runs, one query for the page with its tenants, and a change page read
entirely from the engine's rows: people act on runs through the actions,
which call the services, never by saving the row.
"""

from __future__ import annotations

import re
import uuid

from django.conf import settings
from django.contrib import admin
from django.contrib.admin import ActionLocation
from django.db.models import Q
from django.urls import path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from runs import selectors
from runs.admin import run_actions
from runs.admin.common import (
    EstimatedCountPaginator,
    ReadOnlyInline,
    json_block,
    money_column,
    timestamp,
    timestamp_column,
)
from runs.admin.overview import overview_view
from runs.models import Event, Queue, Run, Step, Worker
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
    fields = (
        "generation",
        "seq",
        "name",
        "kind",
        "status",
        "executions",
        "tokens_in",
        "tokens_out",
        "cost",
        "started",
        "ended",
        "error",
    )
    readonly_fields = fields
    ordering = ("generation", "seq")
    show_change_link = True

    cost = money_column("cost_cents", "cost")
    started = timestamp_column("started_at", "started")
    ended = timestamp_column("ended_at", "ended")


class EventInline(ReadOnlyInline):
    model = Event
    fields = ("seq", "type", "actor_type", "actor_id", "payload", "created")
    readonly_fields = fields
    ordering = ("seq",)
    verbose_name_plural = f"events (the latest {EVENTS_SHOWN})"

    created = timestamp_column("created_at", "created")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    # Narrow columns first: at 1280 px the key ones (status, cost, times) fit beside the filters;
    # admin-extra.css drops the secondary ones on smaller screens.
    list_display = (
        "short_id",
        "kind_name",
        "tenant",
        "queue",
        "status_column",
        "progress",
        "attempt",
        "cost",
        "created",
        "finished",
    )
    list_filter = ("status", KindFilter, QueueFilter, "tenant", "error_kind", "created_at")
    list_select_related = ("tenant",)
    search_fields = ("id__exact", "idempotency_key__exact")
    search_help_text = "A run id or an idempotency key (exact)."
    # The changelist adds "-pk" itself (a total order, served by run_created_idx); naming only
    # created_at keeps a single sort marker in the header.
    ordering = ("-created_at",)
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    raw_id_fields = ("tenant", "parent")
    inlines = (StepInline, EventInline)
    actions = (
        run_actions.cancel_runs,
        run_actions.retry_runs,
        run_actions.retry_from_step,
        run_actions.fork_from_step,
        run_actions.requeue_stuck_runs,
        run_actions.approve_runs,
        run_actions.reject_runs,
        run_actions.resolve_runs,
    )
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "tenant",
                    "kind",
                    "kind_version",
                    "queue",
                    "priority",
                    "status",
                    "waiting_for",
                    "error_kind",
                    "error",
                    "parent",
                    "children_pending",
                    "origin",
                    "origin_step",
                )
            },
        ),
        (
            "Progress",
            {
                "fields": (
                    "current_step",
                    "steps_done",
                    "steps_total",
                    "generation",
                    "attempt",
                    "failures",
                    "max_attempts",
                    "cost",
                    "cost_ceiling",
                    "running_seconds",
                    "deadline_seconds",
                )
            },
        ),
        ("Data", {"fields": ("input_json", "result_json", "idempotency_key", "callback_url")}),
        (
            "Lease (written by the worker)",
            {
                "classes": ("collapse",),
                "fields": (
                    "lease_token",
                    "locked_by",
                    "lease_until",
                    "worker_lease_until",
                    "claimed",
                    "heartbeat",
                    "last_event_seq",
                ),
            },
        ),
        (
            "Times",
            {
                "fields": (
                    "created",
                    "not_before",
                    "started",
                    "finished",
                    "expires",
                    "updated",
                    "cancel_requested",
                    "pause_requested",
                )
            },
        ),
    )

    cost = money_column("cost_cents", "cost")
    cost_ceiling = money_column("cost_ceiling_cents", "cost ceiling")
    created = timestamp_column("created_at", "created")
    not_before = timestamp_column("run_after", "run after")
    started = timestamp_column("started_at", "started")
    finished = timestamp_column("finished_at", "finished")
    expires = timestamp_column("expires_at", "expires")
    updated = timestamp_column("updated_at", "updated")
    cancel_requested = timestamp_column("cancel_requested_at", "cancel requested")
    pause_requested = timestamp_column("pause_requested_at", "pause requested")
    # A run is its worker's while either lease lasts: its own (claim and checkpoints) or its
    # worker's (renewed by the worker's heartbeat, runs.engine.claim.heartbeat).
    lease_until = timestamp_column("locked_until", "run's lease until")
    claimed = timestamp_column("claimed_at", "claimed")
    heartbeat = timestamp_column("heartbeat_at", "last claim or checkpoint")

    @admin.display(description="worker's lease until")
    def worker_lease_until(self, run: Run):
        if run.locked_by is None:
            return None
        worker = Worker.objects.filter(pk=run.locked_by).only("lease_until").first()
        return timestamp(worker.lease_until if worker is not None else None)

    def view_on_site(self, run: Run) -> str:
        # The run's page on the dashboard; change_form_object_tools.html labels the button.
        return reverse("runs:detail", args=[run.id])

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
            kwargs["queryset"] = kwargs["queryset"].filter(
                seq__gt=obj.last_event_seq - EVENTS_SHOWN
            )
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

    @admin.display(description="kind", ordering="kind")
    def kind_name(self, run: Run) -> str:
        # A narrow column may break a long kind after its underscores and dots ("approve_<wbr>then_<wbr>act",
        # a task's "crm.<wbr>tasks.<wbr>pipeline_<wbr>report").
        return format_html_join(
            mark_safe("<wbr>"), "{}", ((part,) for part in re.split(r"(?<=[_.])", run.kind))
        )

    @admin.display(description="status", ordering="status")
    def status_column(self, run: Run) -> str:
        status = run.get_status_display()
        return f"{status} ({run.get_error_kind_display().lower()})" if run.error_kind else status

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
    list_display = (
        "step",
        "run_link",
        "name",
        "kind",
        "status",
        "tokens",
        "cost",
        "started",
        "ended",
    )
    list_filter = ("status", "kind")
    search_fields = ("run__id__exact",)
    search_help_text = "A run id (exact)."
    paginator = EstimatedCountPaginator
    show_full_result_count = False
    list_per_page = 50
    raw_id_fields = ("run",)
    fields = (
        "run",
        "generation",
        "seq",
        "name",
        "kind",
        "status",
        "executions",
        "idempotency_key",
        "tokens_in",
        "tokens_out",
        "cost",
        "started",
        "ended",
        "error",
        "input_json",
        "output_json",
    )
    readonly_fields = fields

    cost = money_column("cost_cents", "cost")
    started = timestamp_column("started_at", "started")
    ended = timestamp_column("ended_at", "ended")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="step")
    def step(self, step: Step) -> str:
        return (
            f"#{step.seq}"
            if step.generation == 1
            else f"#{step.seq} (generation {step.generation})"
        )

    @admin.display(description="tokens in / out")
    def tokens(self, step: Step) -> str:
        return f"{step.tokens_in} / {step.tokens_out}"

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
