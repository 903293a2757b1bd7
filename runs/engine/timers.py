"""Durable time (``ctx.sleep``): a sleep, a wait for a message with a timeout, and the timers' sweep.

A sleep is a ``sleep`` step written as ``waiting`` with the time it ends;
the run then goes back to ``queued`` with ``run_after`` at that time, so it
holds no worker, slot or connection meanwhile, and the claim picks it up
when it is due. Replay finds the step: past its end it is marked done, and
a run woken early (a person resumed it) sleeps the rest.

A wait with a timeout (``wait_for_message(timeout=)``, ``gather(timeout=)``)
parks the run in ``waiting`` with ``wake_at``; ``wake_due`` (the reaper, every
second) queues the runs whose timer is due, and the replayed step decides
that the time ran out.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from uuid import UUID

from django.db import connection, transaction

from runs.notify import count_and_notify
from runs.queries import one, queries, rows


def start_timer_step(
    *,
    run_id: UUID,
    token: int,
    generation: int,
    seq: int,
    name: str,
    kind: str,
    input: str,
    seconds: float | None = None,
    until: datetime | None = None,
    worker_id: UUID,
) -> datetime | None:
    """Write a ``sleep`` or ``message`` step as ``waiting`` until ``until`` (or now + ``seconds``).

    Returns the step's end on the database's clock, or None when the lease is lost.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            queries.start_timer_step,
            {
                "run": run_id,
                "token": token,
                "generation": generation,
                "seq": seq,
                "name": name,
                "kind": kind,
                "input": input,
                "seconds": seconds or 0,
                "until": until,
                "worker": worker_id,
            },
        )
        row = one(cursor)
    return None if row is None else row["until"]


def wake_due(*, batch: int = 500) -> int:
    """Queue the waiting runs whose timer is due, and wake their workers; returns how many woke."""
    with transaction.atomic(savepoint=False):
        with connection.cursor() as cursor:
            cursor.execute(queries.wake_due, {"batch": batch})
            woken = rows(cursor)
        if woken:
            # Their tenants' rows are this transaction's (wake_due locked them): counted, and
            # their workers woken when it commits.
            counts: Counter[UUID] = Counter()
            for row in woken:
                counts[row["tenant_id"]] += row["woken"]
            count_and_notify(counts, {row["queue"] for row in woken}, held=True)
    return sum(row["woken"] for row in woken)
