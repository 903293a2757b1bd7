"""Workers, queues and kinds: who is alive, and the levers that stop claiming (runs.operations)."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.utils import timezone

from runs import operations
from runs.admin.common import operator, timestamp_column, worker_lease
from runs.engine import limits
from runs.models import KindState, Queue, RateLimit, Worker
from runs.registry import all_kinds
from runs.services import QUEUE_NAME


class WorkerStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("alive", "alive"), ("dead", "dead or stopped")]

    def queryset(self, request, queryset):
        alive = {"stopped_at__isnull": True, "last_seen_at__gte": timezone.now() - worker_lease()}
        if self.value() == "alive":
            return queryset.filter(**alive)
        if self.value() == "dead":
            return queryset.exclude(**alive)
        return queryset


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = (
        "short_id",
        "host",
        "pid",
        "state",
        "load",
        "queue_list",
        "last_seen",
        "started",
        "stopped",
    )
    list_filter = (WorkerStateFilter,)
    search_fields = ("host",)
    ordering = ("-last_seen_at",)
    readonly_fields = (
        "id",
        "host",
        "pid",
        "state",
        "queues",
        "kinds",
        "concurrency",
        "runs_held",
        "started",
        "last_seen",
        "stopped",
    )
    fields = readonly_fields

    started = timestamp_column("started_at", "started")
    last_seen = timestamp_column("last_seen_at", "last seen")
    stopped = timestamp_column("stopped_at", "stopped")

    @admin.display(description="worker", ordering="id")
    def short_id(self, worker: Worker) -> str:
        return str(worker.pk)[:8]

    @admin.display(description="runs held", ordering="runs_held")
    def load(self, worker: Worker) -> str:
        return f"{worker.runs_held} / {worker.concurrency}"

    @admin.display(description="state")
    def state(self, worker: Worker) -> str:
        if worker.stopped_at is not None:
            return "stopped"
        silent = timezone.now() - worker.last_seen_at
        if silent > worker_lease():
            return f"dead (silent {int(silent.total_seconds())} s)"
        return "alive"

    @admin.display(description="queues")
    def queue_list(self, worker: Worker) -> str:
        return ", ".join(worker.queues)

    # Rows are the workers' own: registered and heartbeated by the processes.
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class PausableAdmin(admin.ModelAdmin):
    """Queue and kind rows: adding one (paused or not), its global max_running, and the pause /
    resume actions go through the services (runs.operations, runs.engine.limits)."""

    scope = ""  # "queue" or "kind": what runs.engine.limits calls it
    list_display = ("name", "paused", "paused_since", "max_running", "running")
    list_filter = ("paused",)
    ordering = ("name",)
    actions = ("pause", "resume")

    paused_since = timestamp_column("paused_at", "paused at")

    def set_paused(self, *, name: str, paused: bool, actor) -> None:
        raise NotImplementedError

    def get_readonly_fields(self, request, obj=None):
        if obj is not None:
            return ("name", "paused", "paused_since", "running")
        return ("paused_since", "running")

    def save_model(self, request, obj, form, change) -> None:
        if not change:
            self.set_paused(name=obj.name, paused=obj.paused, actor=operator(request))
        if not change or "max_running" in form.changed_data:
            # The counter is set to the runs running now, under the row's lock.
            limits.set_max_running(self.scope, obj.name, obj.max_running)

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # resume instead: the row keeps when it was last paused

    @admin.action(
        description="Pause: workers stop claiming (running runs finish)", permissions=["change"]
    )
    def pause(self, request, queryset):
        self._set(request, queryset, paused=True)

    @admin.action(description="Resume", permissions=["change"])
    def resume(self, request, queryset):
        self._set(request, queryset, paused=False)

    def _set(self, request, queryset, *, paused: bool) -> None:
        names = list(queryset.values_list("name", flat=True))
        for name in names:
            self.set_paused(name=name, paused=paused, actor=operator(request))
        self.message_user(request, f"{'Paused' if paused else 'Resumed'}: {', '.join(names)}.")


class QueueForm(forms.ModelForm):
    class Meta:
        model = Queue
        fields = ("name", "paused", "max_running")

    def clean_name(self) -> str:
        name = self.cleaned_data["name"]
        if not QUEUE_NAME.match(name):
            raise forms.ValidationError(
                "lowercase letters, digits, '_', '.', '-'; at most 64 characters"
            )
        return name


@admin.register(Queue)
class QueueAdmin(PausableAdmin):
    form = QueueForm
    scope = "queue"

    def set_paused(self, *, name: str, paused: bool, actor) -> None:
        operations.set_queue_paused(name=name, paused=paused, actor=actor)


def kind_choices() -> list[tuple[str, str]]:
    return [(k.name, k.name) for k in sorted(all_kinds(), key=lambda k: k.name)]


class KindStateForm(forms.ModelForm):
    # A callable: the kinds registered when the form is shown.
    name = forms.ChoiceField(choices=kind_choices)

    class Meta:
        model = KindState
        fields = ("name", "paused", "max_running")


@admin.register(KindState)
class KindStateAdmin(PausableAdmin):
    form = KindStateForm
    scope = "kind"

    def set_paused(self, *, name: str, paused: bool, actor) -> None:
        operations.set_kind_paused(name=name, paused=paused, actor=actor)


@admin.register(RateLimit)
class RateLimitAdmin(admin.ModelAdmin):
    """Rate limits shared by every worker (runs.engine.ratelimits); manage.py setratelimit does the same."""

    list_display = (
        "key",
        "requests_per_minute",
        "tokens_per_minute",
        "per_tenant_share",
        "paused_until",
    )
    ordering = ("key",)
    fields = ("key", "requests_per_minute", "tokens_per_minute", "per_tenant_share", "paused_until")
    readonly_fields = ("paused_until",)

    def get_readonly_fields(self, request, obj=None):
        return ("key", "paused_until") if obj is not None else ("paused_until",)
