"""Receivers that keep not answering are paused, and resumed by an operator (``WebhookReceiver``).

A receiver is a tenant's scheme, host and port (``RECEIVER_SQL`` of a URL),
the same for a tenant's endpoints and its runs' callback URLs: a run's
``callback_url`` has no endpoint row to pause, and a host that hangs on one
path hangs on the others. After ``RUNS_WEBHOOK_PAUSE_AFTER`` attempts in a
row without an answer (timeouts, failed connections) it is paused: the
claim leaves its deliveries alone, so they wait without spending send slots
or retries. An HTTP answer, even an error, starts the count again, since a
receiver that answers quickly costs nothing to retry on the usual schedule.

Every change is one guarded statement: pausing only a receiver not paused,
resuming only a paused one (and making its waiting deliveries due in the
same statement).

A paused receiver's deliveries are parked (``next_attempt_at`` set to
``PARKED_UNTIL``), so that the claim, which reads each tenant's due
deliveries oldest first, does not read past a paused backlog on every
poll; the delivery loop parks those that arrive while it is paused.
The statements are in ``runs/sql/receivers.sql``.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.conf import settings
from django.db import connection

from runs.events import Actor
from runs.queries import queries, single

logger = logging.getLogger(__name__)

# Far enough to never come due, near enough for a Python datetime.
PARKED_UNTIL = "9999-01-01T00:00:00Z"


def park(*, tenant_id: UUID | None = None, receiver: str = "") -> int:
    """Park the waiting deliveries of paused receivers (of one, or all); returns how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.park_deliveries,
            {"parked": PARKED_UNTIL, "tenant": tenant_id, "receiver": receiver},
        )
        return cursor.rowcount


def attempted(*, tenant_id: UUID, receiver: str, answered: bool, error: str = "") -> bool:
    """Count an attempt that got no answer, or start again after one that did; True when this paused it."""
    if answered:
        with connection.cursor() as cursor:
            cursor.execute(queries.receiver_answered, {"tenant": tenant_id, "receiver": receiver})
        return False
    limit = max(0, settings.RUNS_WEBHOOK_PAUSE_AFTER)
    reason = f"{limit} attempts in a row got no answer; the last: {error}"[:1000]
    with connection.cursor() as cursor:
        cursor.execute(
            queries.receiver_silent,
            {
                "tenant": tenant_id,
                "receiver": receiver,
                "error": error,
                "limit": limit,
                "reason": reason,
            },
        )
        paused = bool(single(cursor)["paused"])
    if paused:
        parked = park(tenant_id=tenant_id, receiver=receiver)
        logger.warning(
            "webhook receiver %s of tenant %s paused (%s deliveries wait): %s",
            receiver,
            tenant_id,
            parked,
            reason,
        )
    return paused


def resume(*, ids: list[int], actor: Actor) -> tuple[int, int]:
    """Resume the paused receivers among ``ids``; returns (receivers resumed, deliveries made due)."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.resume_receivers, {"ids": list(ids), "actor": f"{actor.type}:{actor.id}"[:64]}
        )
        row = single(cursor)
    resumed, due = row["resumed"], row["due"]
    if resumed:
        logger.info(
            "%s webhook receiver(s) resumed by %s:%s, %s deliveries due",
            resumed,
            actor.type,
            actor.id,
            due,
        )
    return resumed, due
