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

The statements are in ``runs/sql/deliveries.sql``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from runs.db import storable_text
from runs.errors import tenant_error
from runs.events import Actor, append_event
from runs.exceptions import InvalidTransition
from runs.metrics import process as metrics
from runs.models import DeliveryStatus, WebhookDelivery
from runs.queries import one, queries, rows
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
            queries.claim_deliveries,
            {
                "batch": batch,
                "lease": lease_seconds,
                "slots": slots,
                "most": slots - slots // 4,
                "flight_tenants": list(in_flight),
                "flight_counts": list(in_flight.values()),
            },
        )
        claimed = rows(cursor)
    jobs = []
    for row in claimed:
        secret = row["secret"] or current_secret(row["tenant_id"])
        jobs.append(
            DeliveryJob(
                id=row["id"],
                attempt=row["attempt"],
                url=row["url"],
                webhook_id=row["webhook_id"],
                event_type=row["event_type"],
                tenant_id=row["tenant_id"],
                body=body_for(
                    event_type=row["event_type"],
                    seq=row["seq"],
                    at=row["at"],
                    actor_type=row["actor_type"],
                    actor_id=row["actor_id"],
                    payload=json.loads(row["payload"]),
                    run_id=str(row["run_id"]),
                    kind=row["kind"],
                    queue=row["queue"],
                    tenant=row["slug"],
                ),
                secrets=[secret] + ([row["previous_secret"]] if row["previous_secret"] else []),
                receiver=row["receiver"] or "",
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
            queries.record_delivery,
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
        row = one(cursor)
        if row is None:
            return None
        status, tenant_id = row["status"], row["tenant_id"]
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
