"""A conversation: a thread whose agent sleeps between turns and wakes on a mention.

Each turn is an ordinary run (``Run.thread``, ``Run.turn``); the messages of
the conversation are ``Message`` rows of the thread, people's and the
agent's replies. What changes a thread is in ``runs.threads`` (people and
integrations) and ``runs.engine.turns`` (a turn that ends).
"""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from runs.models.tenancy import MONEY, Tenant
from runs.states import ThreadPolicy, ThreadStatus


class Thread(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="threads", db_index=False
    )
    # The agent kind that plays its turns.
    kind = models.CharField(max_length=100)
    title = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=ThreadStatus.choices, default=ThreadStatus.ASLEEP
    )
    # What a message does while a turn is live (double-texting), unless the message says otherwise.
    policy = models.CharField(
        max_length=16, choices=ThreadPolicy.choices, default=ThreadPolicy.INTERLEAVE
    )
    # The canonical agent state (goal, budgets, plan, facts, open questions, risk flags...):
    # changed only when a turn ends well, by the patches it recorded (ctx.update_state).
    state = models.JSONField(default=dict, blank=True)
    # Across all its turns: each turn's ceiling is what the thread has left.
    cost_ceiling_cents = models.DecimalField(**MONEY, null=True, blank=True)
    cost_cents = models.DecimalField(**MONEY, default=Decimal(0))
    # How many turns it has had: the next one is turns + 1.
    turns = models.PositiveIntegerField(default=0)
    # The turn that is live (the one turn that may run), NULL while it sleeps or is closed;
    # turns after it wait their turn, in order.
    live_turn = models.PositiveIntegerField(null=True, blank=True)
    # What the agent (ctx.close_thread) or the person who closed it said.
    summary = models.CharField(max_length=300, blank=True, default="")
    # NULL, not "", when absent: the unique constraint applies to keys only.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_hash = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ThreadStatus.values), name="thread_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(policy__in=ThreadPolicy.values), name="thread_policy_valid"
            ),
            models.CheckConstraint(condition=Q(cost_cents__gte=0), name="thread_cost_non_negative"),
            models.CheckConstraint(
                condition=Q(cost_ceiling_cents__isnull=True) | Q(cost_ceiling_cents__gte=0),
                name="thread_cost_ceiling_non_negative",
            ),
            # A live turn exactly while it is active.
            models.CheckConstraint(
                condition=Q(status=ThreadStatus.ACTIVE, live_turn__isnull=False)
                | (~Q(status=ThreadStatus.ACTIVE) & Q(live_turn__isnull=True)),
                name="thread_active_iff_live_turn",
            ),
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="thread_idempotency_key_unique_per_tenant",
            ),
        ]
        indexes = [
            # The dashboard and GET /api/threads (keyset pages).
            models.Index(
                F("tenant"),
                F("created_at").desc(),
                F("id").desc(),
                name="thread_tenant_recent_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.title or f"{self.kind} thread {self.id}"
