"""The Run: one row per run, its state and its lease.

Hot-path rules that shape this file: no index contains a column that a
heartbeat or a checkpoint writes (``locked_until``, ``heartbeat_at``,
``current_step``, ``steps_done``, ``cost_cents``, ``failures``,
``last_event_seq``, ``updated_at``), so both stay HOT updates; the partial
indexes match the claim, the reaper and the dashboard list exactly.
"""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models import (
    Exists,
    ExpressionWrapper,
    F,
    Func,
    OuterRef,
    Q,
    TextField,
    UUIDField,
    Value,
)
from django.db.models.functions import Now
from django.utils import timezone

from runs.models.fleet import Worker
from runs.models.tenancy import MONEY, Tenant
from runs.states import TERMINAL_STATUSES, Compensation, ErrorKind, RunOutcome, RunStatus

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler

# The input's string values at any depth (keys, numbers and JSON syntax left out).
INPUT_STRINGS_PATH = 'strict $.** ? (@.type() == "string")'


class SearchText(Func):
    """What a run search matches: the title, then the input's string values (a JSON array's text).

    Built-in immutable functions over ``title`` and ``input`` only, columns
    that only a submit writes, so heartbeats and checkpoints stay HOT updates
    (a stored generated column would be rewritten by every UPDATE of the row).
    """

    output_field = TextField()

    def __init__(self) -> None:
        super().__init__(F("title"), F("input"))

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, tuple[Any, ...]]:
        # Written out, not a template: run_search_keys_idx holds this text, which a query must repeat.
        title, title_params = compiler.compile(self.source_expressions[0])
        data, data_params = compiler.compile(self.source_expressions[1])
        text = f"{title} || ' ' || jsonb_path_query_array({data}, '{INPUT_STRINGS_PATH}'::jsonpath)::text"
        return f"({text})", (*title_params, *data_params)


class SearchKeys(Func):
    """The search index's keys of a run, each naming its tenant: ``<tenant>:`` and ``<tenant>:<3 letters>``.

    The expression of ``run_search_keys_idx`` (``runs_search_keys``, SQL
    function of migration 0018): every three letters or digits in a row of
    the lowercased ``SearchText``, prefixed with the tenant's id. So each
    tenant has posting lists of its own, and a search reads only its own
    tenant's entries: how many runs of other tenants hold a word can neither
    slow it down nor speed it up (bench/search_isolation.py).
    """

    function = "runs_search_keys"
    output_field = ArrayField(TextField())

    def __init__(self) -> None:
        super().__init__(F("tenant"), SearchText())


class SearchQueryKeys(Func):
    """The keys a run must all have to contain ``text`` (``runs_search_query``, migration 0018).

    The same three letters in a row as ``SearchKeys``, for one tenant, or just
    ``<tenant>:`` (all its runs) if ``text`` has none: never an empty array,
    which would make the index read every tenant's entries.
    """

    function = "runs_search_query"
    output_field = ArrayField(TextField())

    def __init__(self, tenant_id, text: str) -> None:
        super().__init__(
            Value(tenant_id, output_field=UUIDField()), Value(text, output_field=TextField())
        )


class Contains(Func):
    """``array @> array``: every key of the right one is in the left one (what a GIN index of arrays serves)."""

    arg_joiner = " @> "
    template = "(%(expressions)s)"
    output_field = models.BooleanField()


class ILike(Func):
    """``expression ILIKE pattern`` (Django's icontains says ``UPPER(x) LIKE UPPER(p)``)."""

    arg_joiner = " ILIKE "
    template = "(%(expressions)s)"
    output_field = models.BooleanField()


def like_patterns(term: str) -> list[str]:
    """The ILIKE patterns of ``%term%``, with LIKE's own characters (``%``, ``_``, ``\\``) matched literally.

    The input's part of ``SearchText`` is JSON text, where ``"`` and ``\\``
    are escaped: a term with either is looked for in both spellings.
    """
    spellings = dict.fromkeys([term, json.dumps(term, ensure_ascii=False)[1:-1]])
    return [
        "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        for text in spellings
    ]


class RunQuerySet(models.QuerySet):
    def for_tenant(self, tenant) -> RunQuerySet:
        return self.filter(tenant=tenant)

    def queued(self) -> RunQuerySet:
        return self.filter(status=RunStatus.QUEUED)

    def claimable(self, now=None) -> RunQuerySet:
        return self.queued().filter(run_after__lte=now or Now())

    def running(self) -> RunQuerySet:
        return self.filter(status=RunStatus.RUNNING)

    def stale(self, now=None) -> RunQuerySet:
        """Running runs whose lease expired, the run's and its worker's: their worker is gone.

        As the reaper judges them (``runs/sql/reaping.sql``, ``expired_leases``).
        """
        now = now or Now()
        live_worker = Worker.objects.filter(pk=OuterRef("locked_by"), lease_until__gte=now)
        return self.running().filter(locked_until__lt=now).exclude(Exists(live_worker))

    def terminal(self) -> RunQuerySet:
        return self.filter(status__in=TERMINAL_STATUSES)

    def newest_first(self) -> RunQuerySet:
        return self.order_by("-created_at", "-id")

    def matching(self, terms: list[str], *, tenant=None) -> RunQuerySet:
        """Runs whose title or input text contains every one of ``terms``, case-insensitively.

        Each term is a literal substring (``%``, ``_`` and ``\\`` match
        themselves). Without ``tenant`` no index can serve this: a query that
        reads the runs in another index's order (``runs.selectors.search_runs``).
        With it, the search index finds ``tenant``'s runs that hold every three
        letters or digits in a row of the terms (only that tenant's: keys name
        their tenant), and the same ILIKE then keeps the exact matches.
        """
        runs = self
        if tenant is not None:
            # Each term's first spelling: its letters and digits are those of the JSON one.
            letters = " ".join(like_patterns(term)[0] for term in terms)
            runs = runs.filter(Contains(SearchKeys(), SearchQueryKeys(tenant.pk, letters)))
        for term in terms:
            either = Q()
            for pattern in like_patterns(term):
                either |= Q(ILike(SearchText(), Value(pattern)))
            runs = runs.filter(either)
        return runs


def default_expires_at():
    from datetime import timedelta

    return timezone.now() + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by run_tenant_recent_idx and run_claim_order_idx, which lead with it.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    kind = models.CharField(max_length=100)
    kind_version = models.PositiveIntegerField(null=True, blank=True)
    queue = models.CharField(max_length=64, default="default")
    priority = models.SmallIntegerField(default=5)
    input = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    attempt = models.PositiveIntegerField(default=0)
    failures = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    lease_token = models.BigIntegerField(null=True, blank=True)
    locked_by = models.UUIDField(null=True, blank=True)
    locked_until = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    # The database's clock, like the claim's now(): app-server clock skew
    # never delays a run.
    run_after = models.DateTimeField(db_default=Now())
    # A waiting run's timer (wait_for_message or gather timeout): the reaper
    # queues it again at this time. NULL: it waits for its event only.
    wake_at = models.DateTimeField(null=True, blank=True)
    deadline_seconds = models.PositiveIntegerField(default=3600)
    running_seconds = models.FloatField(default=0)
    expires_at = models.DateTimeField(default=default_expires_at)
    # The time to live of a run that has not started (``expires_in`` on submit): not claimed
    # after it, and failed ``expired`` by the reaper. Null: it waits as long as it takes.
    start_by = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    error_kind = models.CharField(max_length=20, choices=ErrorKind.choices, blank=True, default="")
    # What the agent says of its work (ctx.report), written by the exit that ends the run
    # (runs.engine.exit): blank when it said nothing. Untrusted text, one line (runs.titles).
    outcome = models.CharField(max_length=16, choices=RunOutcome.choices, blank=True, default="")
    summary = models.CharField(max_length=300, blank=True, default="")
    # A few words telling the run from its siblings, from its input at submit (runs.titles).
    title = models.CharField(max_length=200, blank=True, default="")
    # NULL, not "", when absent: the unique constraint applies to keys only.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_hash = models.CharField(max_length=64, blank=True, default="")
    cost_cents = models.DecimalField(**MONEY, default=Decimal(0))
    cost_ceiling_cents = models.DecimalField(**MONEY, null=True, blank=True)
    last_event_seq = models.PositiveIntegerField(default=0)
    current_step = models.CharField(max_length=200, blank=True, default="")
    steps_done = models.PositiveIntegerField(default=0)
    steps_total = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    pause_requested_at = models.DateTimeField(null=True, blank=True)
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="children",
        db_index=False,
    )
    # While it waits in ctx.gather(): its awaited children not yet finished,
    # and (with min_success) how many more must succeed; NULL: all of them.
    children_pending = models.PositiveIntegerField(default=0)
    children_needed = models.PositiveIntegerField(null=True, blank=True)
    # What its finished children spent: counted against its cost ceiling.
    children_cost_cents = models.DecimalField(**MONEY, default=Decimal(0))
    # A fork (POST /api/runs/{id}/fork) knows the run and the step it branched from.
    origin = models.ForeignKey(
        "self",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="forks",
        db_index=False,
    )
    origin_step = models.PositiveIntegerField(null=True, blank=True)
    # A turn of a conversation (runs.models.threads): its thread and its number there (1, 2...).
    thread = models.ForeignKey(
        "runs.Thread",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="turn_runs",
        db_index=False,
    )
    turn = models.PositiveIntegerField(null=True, blank=True)
    # At most one live run per key of its tenant may be active (runs.engine.keys): a run submitted
    # while another of its key is live waits, held (status waiting, never started), its turn.
    # NULL, not "", when absent: the key's unique constraint and index apply to keys only.
    concurrency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    # The schedule whose fire submitted it (runs.schedules), if any.
    schedule = models.ForeignKey(
        "runs.Schedule",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        db_index=False,
        related_name="runs",
    )
    compensation = models.CharField(
        max_length=10, choices=Compensation.choices, blank=True, default=""
    )
    generation = models.PositiveIntegerField(default=1)
    callback_url = models.URLField(max_length=2000, blank=True, default="")
    # The W3C trace context of the request that submitted it ({"traceparent": ..., "tracestate": ...}),
    # when OpenTelemetry is on (workers.tracing): every step becomes a span under that request's.
    trace_context = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = RunQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="run_status_valid"
            ),
            models.CheckConstraint(
                condition=(
                    Q(
                        status=RunStatus.RUNNING,
                        lease_token__isnull=False,
                        locked_by__isnull=False,
                        locked_until__isnull=False,
                    )
                    | (
                        ~Q(status=RunStatus.RUNNING)
                        & Q(
                            lease_token__isnull=True,
                            locked_by__isnull=True,
                            locked_until__isnull=True,
                        )
                    )
                ),
                name="run_running_iff_leased",
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=0, priority__lte=9), name="run_priority_0_9"
            ),
            models.CheckConstraint(
                condition=Q(error_kind__in=["", *ErrorKind.values]), name="run_error_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(outcome__in=RunOutcome.values), name="run_outcome_valid"
            ),
            models.CheckConstraint(condition=Q(cost_cents__gte=0), name="run_cost_non_negative"),
            models.CheckConstraint(
                condition=Q(cost_ceiling_cents__isnull=True) | Q(cost_ceiling_cents__gte=0),
                name="run_cost_ceiling_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__gte=1), name="run_max_attempts_positive"
            ),
            models.CheckConstraint(
                condition=Q(compensation__in=Compensation.values), name="run_compensation_valid"
            ),
            models.CheckConstraint(
                condition=Q(children_cost_cents__gte=0), name="run_children_cost_non_negative"
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="run_idempotency_key_unique_per_tenant",
            ),
            # A concurrency key's runs: at most one is active (live and not held behind another),
            # under any interleaving (runs.engine.keys decides, under the key's lock; this holds it).
            models.UniqueConstraint(
                fields=["tenant", "concurrency_key"],
                condition=Q(concurrency_key__isnull=False)
                & ~Q(status__in=sorted(TERMINAL_STATUSES))
                & ~Q(status=RunStatus.WAITING, started_at__isnull=True),
                name="run_one_active_per_key",
            ),
            # A thread's turns are numbered 1, 2... once each; a run is a turn or not at all.
            models.UniqueConstraint(
                fields=["thread", "turn"],
                condition=Q(thread__isnull=False),
                name="run_thread_turn_unique",
            ),
            models.CheckConstraint(
                condition=Q(thread__isnull=True, turn__isnull=True)
                | Q(thread__isnull=False, turn__gte=1),
                name="run_turn_iff_thread",
            ),
        ]
        indexes = [
            # The claim walks each tenant's queue, kind by kind (a loose scan
            # finds the kinds present), in exactly this order.
            models.Index(
                F("tenant"),
                F("queue"),
                F("kind"),
                F("priority"),
                ExpressionWrapper(Q(started_at__isnull=True), output_field=models.BooleanField()),
                F("run_after"),
                # Runs due at the same moment start in the order they were submitted
                # (created_at is the submitting process's clock: one per run), then by id.
                F("created_at"),
                F("id"),
                condition=Q(status=RunStatus.QUEUED),
                name="run_claim_order_idx",
            ),
            # A schedule's runs, newest first (GET /api/runs?schedule=).
            models.Index(
                F("schedule"),
                F("created_at").desc(),
                condition=Q(schedule__isnull=False),
                name="run_schedule_idx",
            ),
            # A concurrency key's live runs, oldest first: who holds it, who is next.
            models.Index(
                F("tenant"),
                F("concurrency_key"),
                F("created_at"),
                F("id"),
                condition=Q(concurrency_key__isnull=False)
                & ~Q(status__in=sorted(TERMINAL_STATUSES)),
                name="run_key_live_idx",
            ),
            # The reaper's pass over runs that never started within their time to live.
            models.Index(
                fields=["start_by"],
                condition=Q(status=RunStatus.QUEUED, start_by__isnull=False),
                name="run_start_by_idx",
            ),
            # The reaper scans running runs only; locked_until stays out so a
            # heartbeat remains a HOT update.
            models.Index(
                fields=["id"], condition=Q(status=RunStatus.RUNNING), name="run_running_idx"
            ),
            # The heartbeat's one read: the runs a worker holds that a person asked to
            # cancel or pause (a handful, whatever the number of runs it holds). Its
            # columns are written by a claim, an exit or a person, never by a
            # heartbeat or a checkpoint.
            models.Index(
                fields=["locked_by"],
                condition=Q(status=RunStatus.RUNNING)
                & (Q(cancel_requested_at__isnull=False) | Q(pause_requested_at__isnull=False)),
                name="run_flagged_by_worker_idx",
            ),
            # The dashboard and GET /api/runs (keyset pages).
            models.Index(
                F("tenant"), F("created_at").desc(), F("id").desc(), name="run_tenant_recent_idx"
            ),
            models.Index(
                fields=["parent"], condition=Q(parent__isnull=False), name="run_parent_idx"
            ),
            # Timers of waiting runs (wait_for_message and gather timeouts): the reaper wakes those due.
            models.Index(
                fields=["wake_at"],
                condition=Q(status=RunStatus.WAITING, wake_at__isnull=False),
                name="run_waiting_timer_idx",
            ),
            models.Index(
                fields=["origin"], condition=Q(origin__isnull=False), name="run_origin_idx"
            ),
            # Live children of a run (a failed or cancelled parent cancels them).
            models.Index(
                fields=["parent"],
                condition=Q(
                    parent__isnull=False,
                    status__in=["queued", "running", "waiting_human", "waiting", "paused"],
                ),
                name="run_live_children_idx",
            ),
            # The operations console (bench/admin_million.py: each one turned a full scan of a
            # million runs into an index scan). Columns and predicates that only transitions
            # write, so heartbeats and checkpoints stay HOT: the admin run list, newest first...
            models.Index(F("created_at").desc(), F("id").desc(), name="run_created_idx"),
            # ...queue depth of live runs (the overview)...
            models.Index(
                fields=["queue", "status"],
                condition=Q(status__in=["queued", "running", "waiting_human", "waiting", "paused"]),
                name="run_live_idx",
            ),
            # ...and runs finished in the last hour (throughput and failure rate).
            models.Index(
                fields=["finished_at"],
                condition=Q(finished_at__isnull=False),
                name="run_finished_idx",
            ),
            # Search by title and input text (runs.selectors.search_runs): keys of three letters
            # or digits per tenant (SearchKeys) serve ILIKE '%term%' for any term with 3 in a row;
            # per tenant, so a search never reads another tenant's entries, and its cost cannot tell
            # whether a word is common elsewhere (bench/search_isolation.py; trigrams over
            # (tenant, text), the index before, read every tenant's entries of the word).
            GinIndex(SearchKeys(), name="run_search_keys_idx"),
        ]
        # The operations console's actions (runs/admin); staff need these besides view_run.
        permissions = [
            ("cancel_run", "Can cancel runs"),
            ("retry_run", "Can retry runs"),
            ("requeue_run", "Can requeue stuck runs"),
            ("approve_run", "Can approve or reject runs"),
            ("resolve_run", "Can resolve ambiguous steps"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES
