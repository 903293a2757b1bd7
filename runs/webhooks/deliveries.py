"""A webhook delivery's life: claimed under a lease, attempted, recorded; retried until delivered or dead.

The delivery loop (``workers.webhooks``) claims due rows with ``FOR UPDATE
SKIP LOCKED`` (any number of loops share the table), marks them
``sending`` until ``next_attempt_at`` (the lease: a loop that dies leaves
rows that become due again), sends, and records the outcome fenced by the
attempt it claimed, so a loop that outlived its lease records nothing.

A failed attempt is retried after ``RUNS_WEBHOOK_RETRY_SCHEDULE`` (5 s,
5 min, 30 min, 2 h, 5 h, 10 h, then 10 h again), with one last attempt when
the delivery is ``RUNS_WEBHOOK_GIVE_UP_SECONDS`` (24 h) old; then it is
``dead``. A refused address and 410 Gone are dead at once.

Fairness: the claim takes due deliveries round-robin across tenants (each
tenant's oldest first, one turn each) and never gives a tenant more than its
share of the loop's send slots, counting the sends it already has in flight;
so a tenant whose receiver hangs holds at most its share while others have
deliveries due. A receiver that keeps not answering is paused
(``runs.webhooks.receivers``): its deliveries are left out of the claim.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from runs.db import sql, storable_text
from runs.errors import tenant_error
from runs.events import Actor, append_event
from runs.exceptions import InvalidTransition
from runs.metrics import process as metrics
from runs.models import RECEIVER_SQL, DeliveryStatus, WebhookDelivery
from runs.webhooks import receivers
from runs.webhooks.signing import current_secret


@dataclass(frozen=True)
class DeliveryJob:
    """A claimed delivery, with everything an attempt sends."""

    id: int
    attempt: int
    url: str
    webhook_id: str
    event_type: str
    tenant_id: UUID
    body: str  # the same bytes on every attempt: built from the Event and the run's fixed fields
    secrets: list[str]  # every secret that signs now (two during a rotation)
    receiver: str = ""  # RECEIVER_SQL of url: whose health the attempt tells about


_LIVE = "d.status IN ('pending', 'sending')"  # the predicate of the claim's index
_LIVE_AND_DUE = f"{_LIVE} AND d.next_attempt_at <= statement_timestamp()"

# The tenants with live deliveries, one index probe each (PostgreSQL has no
# skip scan of its own); then each one's oldest due deliveries, at most a
# loop's slots of them, numbered (`place`). A delivery's turn is its place
# after the tenant's sends in flight, and turns are taken in order
# (round-robin), up to the tenant's share of the slots. So a claim costs the
# number of busy tenants, not the length of anyone's backlog.
_CLAIM_SQL = sql(
    """
WITH RECURSIVE busy(tenant_id) AS (
    (SELECT d.tenant_id FROM runs_webhookdelivery d WHERE {live_delivery} ORDER BY d.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.tenant_id FROM runs_webhookdelivery d
            WHERE {live_delivery} AND d.tenant_id > busy.tenant_id ORDER BY d.tenant_id LIMIT 1)
    FROM busy WHERE busy.tenant_id IS NOT NULL
),
flight AS (
    SELECT * FROM unnest(%(flight_tenants)s::uuid[], %(flight_counts)s::int[]) AS f(tenant_id, sending)
),
due AS (
    SELECT oldest.id, busy.tenant_id, oldest.next_attempt_at,
           row_number() OVER (PARTITION BY busy.tenant_id ORDER BY oldest.next_attempt_at, oldest.id) AS place
    FROM busy CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at FROM runs_webhookdelivery d
        WHERE d.tenant_id = busy.tenant_id AND {live_and_due}
          AND NOT EXISTS (SELECT 1 FROM runs_webhookreceiver h
                          WHERE h.tenant_id = d.tenant_id AND h.paused_at IS NOT NULL AND h.receiver = {receiver_d})
        ORDER BY d.next_attempt_at
        LIMIT %(slots)s
    ) oldest
    WHERE busy.tenant_id IS NOT NULL
),
share AS (
    SELECT GREATEST(1, LEAST(%(most)s, ceil(%(slots)s::numeric / GREATEST(1, count(*)))))::int AS slots
    FROM (SELECT tenant_id FROM due UNION SELECT tenant_id FROM flight) active
),
picked AS (
    SELECT due.id FROM due LEFT JOIN flight USING (tenant_id) CROSS JOIN share
    WHERE due.place + COALESCE(flight.sending, 0) <= share.slots
    ORDER BY due.place + COALESCE(flight.sending, 0), due.next_attempt_at
    LIMIT %(batch)s
),
locked AS (
    SELECT d.id FROM runs_webhookdelivery d
    WHERE d.id IN (SELECT id FROM picked) AND {live_and_due}
    FOR UPDATE OF d SKIP LOCKED
),
claimed AS (
    UPDATE runs_webhookdelivery d SET
        status = 'sending', attempts = d.attempts + 1, last_attempt_at = statement_timestamp(),
        next_attempt_at = statement_timestamp() + make_interval(secs => %(lease)s)
    FROM locked WHERE d.id = locked.id
    RETURNING d.id, d.attempts, d.url, d.webhook_id, d.event_type, d.event_id, d.run_id, d.tenant_id
)
SELECT c.id, c.attempts, c.url, c.webhook_id, c.event_type, c.tenant_id, c.run_id,
       e.seq, e.created_at, e.actor_type, e.actor_id, e.payload::text,
       r.kind, r.queue, t.slug, t.webhook_secret,
       CASE WHEN t.webhook_secret_previous <> '' AND t.webhook_secret_previous_until > statement_timestamp()
            THEN t.webhook_secret_previous END,
       {receiver_c}
FROM claimed c
JOIN runs_event e ON e.id = c.event_id
JOIN runs_run r ON r.id = c.run_id
JOIN runs_tenant t ON t.id = c.tenant_id
ORDER BY c.id
""",
    live_delivery=_LIVE,
    live_and_due=_LIVE_AND_DUE,
    receiver_d=RECEIVER_SQL.format(url="d.url"),
    receiver_c=RECEIVER_SQL.format(url="c.url"),
)


def claim(
    *,
    batch: int,
    lease_seconds: float,
    slots: int | None = None,
    in_flight: dict[UUID, int] | None = None,
) -> list[DeliveryJob]:
    """Up to ``batch`` due deliveries, each now ``sending`` for ``lease_seconds``, shared fairly among tenants.

    ``slots`` is how many sends the caller runs at once (default ``batch``)
    and ``in_flight`` how many of them each tenant holds now. A tenant gets
    at most its share of the slots (``slots`` over the tenants with sends due
    or in flight), and never all of them when it is alone: a quarter stays
    free for a tenant whose delivery comes due next.
    """
    slots = slots or batch
    in_flight = {tenant: count for tenant, count in (in_flight or {}).items() if count > 0}
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL,
            {
                "batch": batch,
                "lease": lease_seconds,
                "slots": slots,
                "most": slots - slots // 4,
                "flight_tenants": list(in_flight),
                "flight_counts": list(in_flight.values()),
            },
        )
        rows = cursor.fetchall()
    jobs = []
    for (
        delivery_id,
        attempt,
        url,
        webhook_id,
        event_type,
        tenant_id,
        run_id,
        seq,
        at,
        actor_type,
        actor_id,
        payload,
        kind,
        queue,
        slug,
        secret,
        previous,
        receiver,
    ) in rows:
        if not secret:
            secret = current_secret(tenant_id)
        jobs.append(
            DeliveryJob(
                id=delivery_id,
                attempt=attempt,
                url=url,
                webhook_id=webhook_id,
                event_type=event_type,
                tenant_id=tenant_id,
                body=body_for(
                    event_type=event_type,
                    seq=seq,
                    at=at,
                    actor_type=actor_type,
                    actor_id=actor_id,
                    payload=json.loads(payload),
                    run_id=str(run_id),
                    kind=kind,
                    queue=queue,
                    tenant=slug,
                ),
                secrets=[secret] + ([previous] if previous else []),
                receiver=receiver or "",
            )
        )
    return jobs


def body_for(
    *,
    event_type: str,
    seq: int,
    at: datetime,
    actor_type: str,
    actor_id: str,
    payload: dict[str, Any],
    run_id: str,
    kind: str,
    queue: str,
    tenant: str,
) -> str:
    """The Standard Webhooks envelope ``{"type", "timestamp", "data"}`` of one Event."""
    data: dict[str, Any] = {
        "run_id": run_id,
        "tenant": tenant,
        "kind": kind,
        "queue": queue,
        "status": event_type.removeprefix("run."),
        "event_seq": seq,
        "actor": {"type": actor_type, "id": actor_id},
    }
    for key in (
        "result",
        "error",
        "error_kind",
        "reason",
        "steps_done",
        "steps_total",
        "cost_cents",
    ):
        if key in payload:
            data[key] = tenant_error(payload[key]) if key == "error" else payload[key]
    return json.dumps(
        {"type": event_type, "timestamp": at.isoformat(), "data": data},
        separators=(",", ":"),
        ensure_ascii=False,
    )


_RECORD_SQL = """
UPDATE runs_webhookdelivery SET
    status = CASE
        WHEN %(delivered)s THEN 'delivered'
        WHEN %(permanent)s OR statement_timestamp() >= created_at + make_interval(secs => %(give_up)s) THEN 'dead'
        ELSE 'pending' END,
    next_attempt_at = LEAST(statement_timestamp() + make_interval(secs => %(gap)s),
                            created_at + make_interval(secs => %(give_up)s)),
    delivered_at = CASE WHEN %(delivered)s THEN statement_timestamp() END,
    response_code = %(code)s,
    response_body = %(body)s,
    last_error = %(error)s,
    failure = %(failure)s
WHERE id = %(id)s AND status = 'sending' AND attempts = %(attempt)s
RETURNING status, tenant_id
"""


def retry_gap(attempt: int) -> float:
    """Seconds before the attempt after ``attempt`` (1 = the first)."""
    schedule = settings.RUNS_WEBHOOK_RETRY_SCHEDULE or [5.0]
    return schedule[min(attempt - 1, len(schedule) - 1)]


def record(
    job: DeliveryJob,
    *,
    delivered: bool,
    permanent: bool,
    code: int | None,
    body: str,
    error: str,
    failure: str = "",
    unanswered: bool = False,
) -> str | None:
    """Record an attempt's outcome; returns the delivery's status, or None when the claim was lost.

    ``unanswered`` (a timeout, no connection) counts towards pausing the
    receiver; any answer, even an error status, starts the count again.
    """
    error = _storable(error)[:1000]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _RECORD_SQL,
            {
                "id": job.id,
                "attempt": job.attempt,
                "delivered": delivered,
                "permanent": permanent,
                "code": code,
                "body": _storable(body)[:4096],
                "error": error,
                "failure": failure,
                "gap": retry_gap(job.attempt),
                "give_up": settings.RUNS_WEBHOOK_GIVE_UP_SECONDS,
            },
        )
        row = cursor.fetchone()
        if row is None:
            return None
        status, tenant_id = row
        if job.receiver and (unanswered or code is not None):
            receivers.attempted(
                tenant_id=tenant_id, receiver=job.receiver, answered=not unanswered, error=error
            )
    metrics.webhook_attempt(result=ATTEMPT_RESULTS.get(status, status))
    return status


# A delivery's status after an attempt, as the metrics name the attempt's result.
ATTEMPT_RESULTS = {"delivered": "delivered", "pending": "retry", "dead": "dead"}


def _storable(text: str) -> str:
    return storable_text(text or "") or ""


@transaction.atomic
def redeliver(*, delivery: WebhookDelivery, actor: Actor) -> WebhookDelivery:
    """Send a delivered or dead delivery's Event again, as a new delivery with the same ``webhook-id``."""
    delivery = WebhookDelivery.objects.select_for_update().get(pk=delivery.pk)
    if delivery.is_live:
        raise InvalidTransition(
            "this delivery is still being attempted; wait for it to be delivered or dead"
        )
    again = WebhookDelivery.objects.create(
        event_id=delivery.event_id,
        run_id=delivery.run_id,
        tenant_id=delivery.tenant_id,
        endpoint_id=delivery.endpoint_id,
        url=delivery.url,
        event_type=delivery.event_type,
        webhook_id=delivery.webhook_id,
        status=DeliveryStatus.PENDING,
    )
    # Who asked, in the run's audit trail (not a webhook type: it sends nothing itself).
    append_event(
        run_id=delivery.run_id,
        type="webhook.redelivered",
        actor=actor,
        payload={
            "delivery": again.pk,
            "of": delivery.pk,
            "event_type": delivery.event_type,
            "webhook_id": delivery.webhook_id,
        },
    )
    return again
