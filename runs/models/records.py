"""What a run leaves behind: its steps and their attempts, messages, artifacts and Events (the outbox)."""

from __future__ import annotations

from decimal import Decimal

from django.db import models
from django.db.models import Q
from django.utils import timezone

from runs.models.run import Run
from runs.models.tenancy import MONEY
from runs.states import StepKind, StepStatus


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
            models.UniqueConstraint(
                fields=["run", "generation", "seq"], name="step_unique_run_generation_seq"
            ),
            models.CheckConstraint(
                condition=Q(status__in=StepStatus.values), name="step_status_valid"
            ),
            models.CheckConstraint(condition=Q(kind__in=StepKind.values), name="step_kind_valid"),
            models.CheckConstraint(condition=Q(cost_cents__gte=0), name="step_cost_non_negative"),
        ]
        ordering = ["run", "generation", "seq"]

    def __str__(self) -> str:
        return f"{self.run_id} #{self.seq} {self.name}"


class StepAttempt(models.Model):
    """One failed or interrupted execution of a step: the audit trail and the money keep every try."""

    step = models.ForeignKey(Step, on_delete=models.CASCADE, related_name="attempts")
    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="step_attempts", db_index=False
    )
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
    """A person's message to a run; consumed by the run's `message` step with its checkpoint.

    In a conversation (``thread`` set) it is also a line of the thread: a
    person's message, delivered to a turn (``run``) or kept for the next one
    (``run`` NULL), or a turn's reply (``author_type`` "agent", ``run`` the
    turn, ``reply_key`` the step that said it; never read as a message).
    """

    run = models.ForeignKey(
        Run, on_delete=models.CASCADE, related_name="messages", db_index=False, null=True
    )
    thread = models.ForeignKey(
        "runs.Thread",
        on_delete=models.CASCADE,
        related_name="messages",
        db_index=False,
        null=True,
        blank=True,
    )
    # It calls the agent: a sleeping thread wakes for it (a new turn).
    mention = models.BooleanField(default=False)
    # A reply's step in its turn ("generation:seq"): the reply is written once however often
    # the step runs.
    reply_key = models.CharField(max_length=32, null=True, blank=True)  # noqa: DJ001
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
                fields=["run", "id"],
                condition=Q(consumed_by_step__isnull=True),
                name="message_unconsumed_idx",
            ),
            # A thread's conversation in order (GET /api/threads/{id}/messages, ctx.history).
            models.Index(
                fields=["thread", "id"],
                condition=Q(thread__isnull=False),
                name="message_thread_idx",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "reply_key"],
                condition=Q(reply_key__isnull=False),
                name="message_reply_once_per_step",
            ),
            models.CheckConstraint(
                condition=Q(run__isnull=False) | Q(thread__isnull=False),
                name="message_of_a_run_or_a_thread",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.run_id} message {self.pk}"


class Artifact(models.Model):
    """A large step output (or tool output) kept out of the step row; the model sees an excerpt."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="artifacts", db_index=False)
    step = models.ForeignKey(
        Step, on_delete=models.SET_NULL, null=True, blank=True, related_name="artifacts"
    )
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
