"""queued → running: the claim, the heartbeat that keeps a claim, and adopting a claim whose answer was lost.

The statements, with why each clause is there, are in ``runs/sql/claim.sql``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db import transaction

from runs.db import engine_cursor, loads
from runs.engine.limits_seen import limits_seen
from runs.queries import queries, rows
from runs.states import RunStatus


@dataclass
class ClaimedRun:
    id: UUID
    tenant_id: UUID
    kind: str
    kind_version: int | None
    input: Any
    lease_token: int
    attempt: int
    failures: int
    max_attempts: int
    generation: int
    deadline_seconds: int
    running_seconds: float
    steps_done: int
    steps_total: int | None
    cost_cents: Decimal
    cost_ceiling_cents: Decimal | None
    cancel_requested: bool
    pause_requested: bool
    queue: str
    claimed_at: datetime  # the database's clock: timers (sleeps, timeouts) compare with it
    parent_id: UUID | None = None
    children_cost_cents: Decimal = Decimal(0)
    compensation: str = ""  # "running" while its saga rolls back (runs.engine.saga)
    run_after: datetime | None = (
        None  # when it became due: claimed_at - run_after is its wait in the queue
    )
    created_at: datetime | None = None  # when it was submitted
    started_at: datetime | None = None  # its first claim's time
    priority: int = 5
    trace_context: dict | None = (
        None  # the submitting request's W3C trace context (workers.tracing)
    )
    thread_id: UUID | None = None  # a turn's thread (runs.threads): its exit ends the turn there


def _claimed(found: list[dict[str, Any]]) -> list[ClaimedRun]:
    """The claim's rows (by column name: the statement's columns are ClaimedRun's fields)."""
    claimed = [ClaimedRun(**row) for row in found]
    for run in claimed:
        run.input = loads(run.input)
        run.trace_context = loads(run.trace_context) if run.trace_context else None
    return claimed


def claim(
    *,
    worker_id: UUID,
    queues: list[str],
    kinds: dict[str, int],
    n: int,
    lease: float,
    resumes: Mapping[str, Iterable[int]] | None = None,
    returned: Iterable[tuple[UUID, datetime]] = (),
) -> list[ClaimedRun]:
    """Claim up to ``n`` runnable runs of ``kinds`` (name → version) in ``queues``. One transaction.

    A run that already recorded a version is claimed only when its kind's
    version here, or one of ``resumes[kind]``, is that version. ``returned``
    gives back the tenant slots of runs that left running without giving
    theirs back, as (tenant, ``Exited.at``) pairs, whatever is claimed.
    """
    returned = list(returned)
    if (n <= 0 and not returned) or not kinds or not queues:
        return []
    names = list(kinds)
    pairs = sorted(
        {(k, kinds[k]) for k in names} | {(k, v) for k, vs in (resumes or {}).items() for v in vs}
    )
    params: dict[str, Any] = {
        "queues": list(queues),
        "kinds": names,
        "versions": [kinds[k] for k in names],
        "rkinds": [k for k, _ in pairs],
        "rversions": [v for _, v in pairs],
        "n": max(n, 0),
        "worker": worker_id,
        "ret_tenants": [tenant for tenant, _ in returned],
        "ret_times": [at for _, at in returned],
        "lease": lease,
        "queued": RunStatus.QUEUED,
    }
    # Two statements in one transaction: the claim locks and decides, claim_counts writes the
    # counters it decided (claim.sql says why they are apart).
    with transaction.atomic(savepoint=False), engine_cursor() as cursor:
        limited = limits_seen.in_force(cursor)
        params["limited"] = limited
        cursor.execute(queries.claim_limited if limited else queries.claim, params)
        claimed = _claimed(rows(cursor))
        if claimed or returned:
            cursor.execute(
                queries.claim_counts,
                {
                    "tenants": [run.tenant_id for run in claimed],
                    "kinds": [run.kind for run in claimed],
                    "queues": [run.queue for run in claimed],
                    "ret_tenants": params["ret_tenants"],
                    "ret_times": params["ret_times"],
                    "limited": limited,
                },
            )
        return claimed


def claimed_but_not_held(*, worker_id: UUID, held: Iterable[UUID]) -> list[ClaimedRun]:
    """Runs the database says this worker holds but the worker does not know of.

    A claim whose commit succeeded but whose answer was lost (the connection
    broke after COMMIT) leaves such runs; a worker retrying the claim adopts
    them first instead of leaving them to the reaper.
    """
    with engine_cursor() as cursor:
        cursor.execute(queries.claimed_but_not_held, {"worker": worker_id, "held": list(held)})
        return _claimed(rows(cursor))


def heartbeat(
    *, worker_id: UUID, held: dict[int, UUID], lease: float, check: bool = False
) -> dict[int, tuple[bool, bool]]:
    """Renew the worker's lease, which keeps every run it holds (lease token → run id).

    One statement on the worker's row, whatever the number of runs held
    (``runs/sql/claim.sql``, ``heartbeat``). Returns the lease tokens still
    held with their (cancel, pause) request flags; a token missing from the
    answer has lost its lease. Only when the worker's lease had lapsed (the
    reaper may have taken runs meanwhile), or when ``check`` asks (a person
    acted on a run, or the reaper stopped one past its deadline), are the runs
    themselves read, in a second statement.
    """
    with engine_cursor() as cursor:
        cursor.execute(queries.heartbeat, {"worker": worker_id, "lease": lease, "held": len(held)})
        found = rows(cursor)
        # No row: the worker's row is gone (deleted by hand); its runs are checked as after a lapse.
        lapsed = not found or found[0]["lapsed"]
        flags = {
            row["lease_token"]: (row["cancel"], row["pause"])
            for row in found
            if row["lease_token"] is not None
        }
        if not lapsed and not check:
            return {token: flags.get(token, (False, False)) for token in held}
        tokens = list(held)
        cursor.execute(queries.held_runs, {"ids": [held[t] for t in tokens], "tokens": tokens})
        return {row["lease_token"]: (row["cancel"], row["pause"]) for row in rows(cursor)}
