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
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.conf import settings
from django.db import connection

from runs.db import sql
from runs.events import Actor
from runs.models import RECEIVER_SQL

logger = logging.getLogger(__name__)

# One more silent attempt; the count reaching the limit pauses the receiver.
_SILENT_SQL = """
INSERT INTO runs_webhookreceiver AS h (tenant_id, receiver, silent_attempts, last_error, last_failure_at,
                                       paused_at, paused_reason, resumed_at, resumed_by)
VALUES (%(tenant)s, %(receiver)s, 1, %(error)s, statement_timestamp(),
        CASE WHEN %(limit)s = 1 THEN statement_timestamp() END, CASE WHEN %(limit)s = 1 THEN %(reason)s ELSE '' END,
        NULL, '')
ON CONFLICT (tenant_id, receiver) DO UPDATE SET
    silent_attempts = h.silent_attempts + 1,
    last_error = EXCLUDED.last_error,
    last_failure_at = EXCLUDED.last_failure_at,
    paused_at = CASE WHEN h.paused_at IS NULL AND %(limit)s > 0 AND h.silent_attempts + 1 >= %(limit)s
                     THEN statement_timestamp() ELSE h.paused_at END,
    paused_reason = CASE WHEN h.paused_at IS NULL AND %(limit)s > 0 AND h.silent_attempts + 1 >= %(limit)s
                         THEN %(reason)s ELSE h.paused_reason END
RETURNING paused_at IS NOT DISTINCT FROM statement_timestamp()
"""

_ANSWERED_SQL = """
UPDATE runs_webhookreceiver SET silent_attempts = 0
WHERE tenant_id = %(tenant)s AND receiver = %(receiver)s AND silent_attempts > 0 AND paused_at IS NULL
"""

_RESUME_SQL = sql(
    """
WITH resumed AS (
    UPDATE runs_webhookreceiver SET paused_at = NULL, paused_reason = '', silent_attempts = 0,
                                    resumed_at = statement_timestamp(), resumed_by = %(actor)s
    WHERE id = ANY(%(ids)s) AND paused_at IS NOT NULL
    RETURNING tenant_id, receiver
),
due AS (
    UPDATE runs_webhookdelivery d SET next_attempt_at = LEAST(d.next_attempt_at, statement_timestamp())
    FROM resumed r
    WHERE d.status = 'pending' AND d.tenant_id = r.tenant_id AND {receiver_d} = r.receiver
    RETURNING d.id
)
SELECT (SELECT count(*) FROM resumed), (SELECT count(*) FROM due)
""",
    receiver_d=RECEIVER_SQL.format(url="d.url"),
)


# Far enough to never come due, near enough for a Python datetime.
PARKED_UNTIL = "9999-01-01T00:00:00Z"

_PARK_SQL = sql(
    """
UPDATE runs_webhookdelivery d SET next_attempt_at = %(parked)s::timestamptz
FROM runs_webhookreceiver h
WHERE h.paused_at IS NOT NULL AND (%(tenant)s::uuid IS NULL OR (h.tenant_id = %(tenant)s AND h.receiver = %(receiver)s))
  AND d.tenant_id = h.tenant_id AND d.status = 'pending' AND d.next_attempt_at < %(parked)s::timestamptz
  AND {receiver_d} = h.receiver
""",
    receiver_d=RECEIVER_SQL.format(url="d.url"),
)


def park(*, tenant_id: UUID | None = None, receiver: str = "") -> int:
    """Park the waiting deliveries of paused receivers (of one, or all); returns how many."""
    with connection.cursor() as cursor:
        cursor.execute(
            _PARK_SQL, {"parked": PARKED_UNTIL, "tenant": tenant_id, "receiver": receiver}
        )
        return cursor.rowcount


def attempted(*, tenant_id: UUID, receiver: str, answered: bool, error: str = "") -> bool:
    """Count an attempt that got no answer, or start again after one that did; True when this paused it."""
    if answered:
        with connection.cursor() as cursor:
            cursor.execute(_ANSWERED_SQL, {"tenant": tenant_id, "receiver": receiver})
        return False
    limit = max(0, settings.RUNS_WEBHOOK_PAUSE_AFTER)
    reason = f"{limit} attempts in a row got no answer; the last: {error}"[:1000]
    with connection.cursor() as cursor:
        cursor.execute(
            _SILENT_SQL,
            {
                "tenant": tenant_id,
                "receiver": receiver,
                "error": error,
                "limit": limit,
                "reason": reason,
            },
        )
        paused = bool(cursor.fetchone()[0])
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
        cursor.execute(_RESUME_SQL, {"ids": list(ids), "actor": f"{actor.type}:{actor.id}"[:64]})
        resumed, due = cursor.fetchone()
    if resumed:
        logger.info(
            "%s webhook receiver(s) resumed by %s:%s, %s deliveries due",
            resumed,
            actor.type,
            actor.id,
            due,
        )
    return resumed, due
