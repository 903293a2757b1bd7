"""Data model of DESIGN.md §4.

Hot-path rules that shape this file: no index contains a column that a
heartbeat or a checkpoint writes (``locked_until``, ``heartbeat_at``,
``current_step``, ``steps_done``, ``cost_cents``, ``failures``,
``last_event_seq``, ``updated_at``), so both stay HOT updates; the partial
indexes match the claim, the reaper and the dashboard list exactly.
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import ExpressionWrapper, F, Q
from django.db.models.functions import Now
from django.utils import timezone

from runs.states import TERMINAL_STATUSES, ErrorKind, RunStatus, StepKind, StepStatus

MONEY = {"max_digits": 18, "decimal_places": 6}

__all__ = ["TERMINAL_STATUSES", "ErrorKind", "RunStatus", "StepKind", "StepStatus"]


class Tenant(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=64, unique=True)
    max_running = models.PositiveIntegerField(default=3)
    max_queued = models.PositiveIntegerField(default=1000)
    default_cost_ceiling_cents = models.DecimalField(**MONEY, null=True, blank=True)
    daily_cost_cap_cents = models.DecimalField(**MONEY, null=True, blank=True)
    paused = models.BooleanField(default=False)
    # Live count of the tenant's running runs: changed only by the claim's
    # guarded update and the one exit from running; the reaper reconciles it.
    running = models.IntegerField(default=0, editable=False)
    # Approximate count of its queued runs, for backpressure (max_queued):
    # raised after a submit commits, lowered by the claim, raised by an exit
    # to queued; the reaper reconciles it. A count per submit would cost
    # O(max_queued).
    queued = models.IntegerField(default=0, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(running__gte=0), name="tenant_running_non_negative"),
        ]

    def __str__(self) -> str:
        return self.slug


class TenantDailyCost(models.Model):
    """Money a tenant spent on one UTC day; written by checkpoints, read by the claim (daily cap)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="daily_costs", db_index=False)
    day = models.DateField()
    cost_cents = models.DecimalField(**MONEY, default=Decimal(0))

    class Meta:
        constraints = [models.UniqueConstraint(fields=["tenant", "day"], name="tenantdailycost_unique_tenant_day")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day}: {self.cost_cents}"


class Pausable(models.Model):
    """Operator state of something workers claim from; with no row it is active."""

    paused = models.BooleanField(default=False)
    paused_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.pk}{' (paused)' if self.paused else ''}"


class Queue(Pausable):
    """Operator state of a queue."""

    name = models.CharField(max_length=64, primary_key=True)


class KindState(Pausable):
    """Operator state of an agent kind."""

    name = models.CharField(max_length=100, primary_key=True)


class ApiKey(models.Model):
    class Scope(models.TextChoices):
        READ = "runs:read"  # read runs, steps, kinds
        WRITE = "runs:write"  # submit and control runs
        APPROVE = "runs:approve"  # approve, reject and resolve

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=200)
    prefix = models.CharField(max_length=16, db_index=True)
    secret_sha256 = models.CharField(max_length=64, unique=True)
    scopes = ArrayField(models.CharField(max_length=32, choices=Scope.choices), default=list)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class Membership(models.Model):
    class Role(models.TextChoices):
        VIEWER = "viewer"  # reads
        OPERATOR = "operator"  # also submits, cancels, pauses, resumes, retries, messages
        APPROVER = "approver"  # also approves, rejects and resolves

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant"),
            models.CheckConstraint(condition=Q(role__in=["viewer", "operator", "approver"]), name="membership_role_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.tenant} as {self.role}"


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
        """Running runs whose lease expired: their worker is gone."""
        return self.running().filter(locked_until__lt=now or Now())

    def terminal(self) -> RunQuerySet:
        return self.filter(status__in=TERMINAL_STATUSES)

    def newest_first(self) -> RunQuerySet:
        return self.order_by("-created_at", "-id")


def default_expires_at():
    from datetime import timedelta

    return timezone.now() + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by run_tenant_recent_idx and run_claim_idx, which lead with it.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="runs", db_index=False)
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
    deadline_seconds = models.PositiveIntegerField(default=3600)
    running_seconds = models.FloatField(default=0)
    expires_at = models.DateTimeField(default=default_expires_at)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    error_kind = models.CharField(max_length=20, choices=ErrorKind.choices, blank=True, default="")
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
        "self", on_delete=models.CASCADE, null=True, blank=True, related_name="children", db_index=False
    )
    children_pending = models.PositiveIntegerField(default=0)
    generation = models.PositiveIntegerField(default=1)
    callback_url = models.URLField(max_length=2000, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    objects = RunQuerySet.as_manager()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status_valid"),
            models.CheckConstraint(
                condition=(
                    Q(status=RunStatus.RUNNING, lease_token__isnull=False, locked_by__isnull=False, locked_until__isnull=False)
                    | (~Q(status=RunStatus.RUNNING) & Q(lease_token__isnull=True, locked_by__isnull=True, locked_until__isnull=True))
                ),
                name="run_running_iff_leased",
            ),
            models.CheckConstraint(condition=Q(priority__gte=0, priority__lte=9), name="run_priority_0_9"),
            models.CheckConstraint(condition=Q(error_kind__in=["", *ErrorKind.values]), name="run_error_kind_valid"),
            models.CheckConstraint(condition=Q(cost_cents__gte=0), name="run_cost_non_negative"),
            models.CheckConstraint(
                condition=Q(cost_ceiling_cents__isnull=True) | Q(cost_ceiling_cents__gte=0),
                name="run_cost_ceiling_non_negative",
            ),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="run_max_attempts_positive"),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="run_idempotency_key_unique_per_tenant",
            ),
        ]
        indexes = [
            # The claim walks each tenant's queue in exactly this order.
            models.Index(
                F("tenant"),
                F("queue"),
                F("priority"),
                ExpressionWrapper(Q(started_at__isnull=True), output_field=models.BooleanField()),
                F("run_after"),
                F("id"),
                condition=Q(status=RunStatus.QUEUED),
                name="run_claim_idx",
            ),
            # The reaper scans running runs only; locked_until stays out so a
            # heartbeat remains a HOT update.
            models.Index(fields=["id"], condition=Q(status=RunStatus.RUNNING), name="run_running_idx"),
            # The dashboard and GET /api/runs (keyset pages).
            models.Index(F("tenant"), F("created_at").desc(), F("id").desc(), name="run_tenant_recent_idx"),
            models.Index(fields=["parent"], condition=Q(parent__isnull=False), name="run_parent_idx"),
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
            models.Index(fields=["finished_at"], condition=Q(finished_at__isnull=False), name="run_finished_idx"),
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


class Step(models.Model):
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    seq = models.PositiveIntegerField()
    generation = models.PositiveIntegerField(default=1)
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=StepKind.choices, default=StepKind.CUSTOM)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    idempotency_key = models.CharField(max_length=255, blank=True, default="")
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost_cents = models.DecimalField(**MONEY, default=Decimal(0))
    status = models.CharField(max_length=16, choices=StepStatus.choices, default=StepStatus.RUNNING)
    executions = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    # Its name, input, output or error held characters PostgreSQL cannot store
    # (NUL, lone surrogates), kept as U+FFFD: what the agent saw on replay.
    text_replaced = models.BooleanField(db_default=False, default=False)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "generation", "seq"], name="step_unique_run_generation_seq"),
            models.CheckConstraint(condition=Q(status__in=StepStatus.values), name="step_status_valid"),
            models.CheckConstraint(condition=Q(kind__in=StepKind.values), name="step_kind_valid"),
            models.CheckConstraint(condition=Q(cost_cents__gte=0), name="step_cost_non_negative"),
        ]
        ordering = ["run", "generation", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.name}"


class StepAttempt(models.Model):
    """One failed or interrupted execution of a step: the audit trail and the money keep every try."""

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="attempts")
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="step_attempts", db_index=False)
    attempt = models.PositiveIntegerField()
    error = models.TextField(blank=True, default="")
    error_kind = models.CharField(max_length=20, blank=True, default="")
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost_cents = models.DecimalField(**MONEY, default=Decimal(0))
    worker = models.UUIDField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["run", "step"], name="stepattempt_run_step_idx")]

    def __str__(self) -> str:
        return f"{self.step_id} attempt {self.attempt}"


class Message(models.Model):
    """A person's message to a run; consumed by the run's `message` step with its checkpoint."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="messages", db_index=False)
    author_type = models.CharField(max_length=16)
    author_id = models.CharField(max_length=64, blank=True, default="")
    text = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)
    consumed_by_step = models.ForeignKey(
        Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="consumed_messages"
    )

    class Meta:
        ordering = ["run", "id"]
        indexes = [
            models.Index(fields=["run", "id"], name="message_run_idx"),
            models.Index(
                fields=["run", "id"], condition=Q(consumed_by_step__isnull=True), name="message_unconsumed_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} message {self.pk}"


class Artifact(models.Model):
    """A large step output (or tool output) kept out of the step row; the model sees an excerpt."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts", db_index=False)
    step = models.ForeignKey(Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts")
    name = models.CharField(max_length=200)
    content_type = models.CharField(max_length=100, default="text/plain")
    size = models.PositiveBigIntegerField(default=0)
    sha256 = models.CharField(max_length=64)
    summary = models.TextField(blank=True, default="")
    file = models.FileField(upload_to="artifacts/%Y/%m/%d/", max_length=500)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["run", "id"], name="artifact_run_idx")]

    def __str__(self) -> str:
        return f"{self.name} ({self.size} bytes)"


class Event(models.Model):
    """Outbox: one row per transition and finished step, written with the change."""

    class ActorType(models.TextChoices):
        USER = "user"  # a person through the dashboard or admin
        API_KEY = "api_key"  # an integration through the API
        WORKER = "worker"  # a worker process
        SYSTEM = "system"  # the reaper or another internal actor

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events", db_index=False)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=64)
    actor_type = models.CharField(max_length=16, choices=ActorType.choices)
    actor_id = models.CharField(max_length=64, blank=True, default="")
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="event_unique_run_seq")]
        ordering = ["run", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.type}"


class Worker(models.Model):
    """A worker process; a restarted process registers under a new id."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = ArrayField(models.CharField(max_length=64), default=list)
    kinds = ArrayField(models.CharField(max_length=100), default=list)
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    runs_held = models.PositiveIntegerField(default=0)
    stopped_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"
