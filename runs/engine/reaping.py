"""The reaper's transitions: rescue expired leases, stop runs past their deadline, expire waiting runs,
and keep the tenant counters true.

Every write is fenced: a rescue matches only the lease token it read and
only while that lease is still expired, so a run that finished or was
claimed again between the read and the write is left alone. Every read is
bounded: by a batch size on the running-runs index, or by the tenant's own
limit. The statements are in ``runs/sql/reaping.sql``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from uuid import UUID

from django.db import connection, transaction

from runs.engine import family
from runs.engine.exit import Exit, leave
from runs.engine.turns import lock_thread_of, tell_turn_ended
from runs.events import Actor
from runs.metrics import process as metrics
from runs.notify import count_and_notify
from runs.queries import one, queries, rows
from runs.states import RunStatus


@dataclass(frozen=True)
class StaleLease:
    run_id: UUID
    token: int
    queue: str
    parent_id: UUID | None = None
    thread_id: UUID | None = None


def find_expired_leases(*, limit: int) -> list[StaleLease]:
    """Running runs whose lease has expired (on the partial index of running runs)."""
    with connection.cursor() as cursor:
        cursor.execute(queries.expired_leases, {"limit": limit})
        return [StaleLease(**row) for row in rows(cursor)]


def rescue(
    stale: StaleLease,
    *,
    actor_type: str = "system",
    actor_id: str = "reaper",
    reason: str = "lease_expired",
    error: str = "the worker holding this run stopped heartbeating (lease expired)",
) -> str | None:
    """Return one expired run to the queue (a failed attempt), or fail it when its budget is spent.

    Returns the status reached, or None when the run was no longer the one
    read (finished, re-claimed or heartbeated meanwhile).
    """
    outcome = leave(
        Exit.rescue(reason=reason, error=error, actor_type=actor_type, actor_id=actor_id).of_run(
            stale.run_id, stale.token, parent=stale.parent_id, thread=stale.thread_id
        )
    )
    if outcome is None:
        return None
    if reason == "lease_expired":
        metrics.lease_rescued(queue=outcome.queue, status=outcome.status)
    return outcome.status


def find_past_deadline(*, limit: int) -> list[StaleLease]:
    """Running runs (alive or not) whose running time is past their deadline."""
    with connection.cursor() as cursor:
        cursor.execute(queries.past_deadline, {"limit": limit})
        return [StaleLease(**row) for row in rows(cursor)]


def stop_past_deadline(stale: StaleLease) -> bool:
    """Fail a run past its deadline, fenced on the lease token read; its worker then finds its lease lost."""
    outcome = leave(
        Exit.fail(
            reason="deadline",
            error="the run used up its running time (deadline); stopped by the reaper",
            error_kind="deadline",
        ).of_run(
            stale.run_id,
            stale.token,
            parent=stale.parent_id,
            thread=stale.thread_id,
            actor_type="system",
            actor_id="reaper",
        )
    )
    return outcome is not None


def expire_waiting(*, batch: int) -> int:
    """Fail up to ``batch`` runs that waited for people past their ``expires_at``; returns how many.

    Their children are cancelled by the reaper's sweep of orphans
    (``family.orphaned_children``); an expired child wakes its parent, an
    expired turn hands its thread to the next turn (``runs.threads.turns``).
    """
    with connection.cursor() as cursor:
        cursor.execute(queries.expire_waiting, {"batch": batch, "only": None})
        expired = rows(cursor)
        cursor.execute(queries.expired_children, {"batch": batch})
        children = rows(cursor)
    for child in children:
        with transaction.atomic(), connection.cursor() as cursor:
            if child["thread_id"] is not None:
                lock_thread_of(child["id"])  # before the run's row: the lock order of conversations
            cursor.execute(queries.expire_waiting, {"batch": 1, "only": child["id"]})
            row = one(cursor)
            if row:
                expired.append(row)
                if child["thread_id"] is not None:
                    tell_turn_ended(child["id"], actor=Actor(type="system", id="reaper"))
                if child["parent_id"] is not None:
                    family.wake_after_commit(
                        family.child_finished(
                            child_id=child["id"], parent_id=child["parent_id"], succeeded=False
                        )
                    )
    for row in expired:
        metrics.run_finished(queue=row["queue"], kind=row["kind"], status=RunStatus.FAILED)
    return len(expired)


def expire_unstarted(*, batch: int) -> int:
    """Fail up to ``batch`` queued runs that never started before their ``start_by`` (``expires_in``).

    Only runs submitted with ``expires_in`` have one; a run that started once
    (and was queued again by a retry) is not bound by it.
    """
    with transaction.atomic(savepoint=False):
        with connection.cursor() as cursor:
            cursor.execute(queries.expire_unstarted, {"batch": batch})
            expired = rows(cursor)
        if expired:
            # Their tenants' rows are this transaction's (expire_unstarted locked them).
            left: Counter[UUID] = Counter()
            for row in expired:
                left[row["tenant_id"]] -= 1
            count_and_notify(left, queues=(), held=True)
    for row in expired:
        metrics.run_finished(queue=row["queue"], kind=row["kind"], status=RunStatus.FAILED)
    return len(expired)


def reconcile_tenants(*, queued: bool) -> int:
    """Set tenants' counters to the truth, each under its row's lock; returns how many were fixed.

    ``running`` is checked on every call; with ``queued`` every tenant's
    queued counter is checked too (a bounded count per tenant), which the
    reaper does less often.
    """
    with connection.cursor() as cursor:
        cursor.execute(queries.all_tenants if queued else queries.running_suspects)
        suspects = [row["id"] for row in rows(cursor)]
    fixed = 0
    for tenant_id in suspects:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(queries.lock_tenant, {"tenant": tenant_id})
            cursor.execute(queries.fix_tenant, {"tenant": tenant_id, "queued": queued})
            fixed += cursor.rowcount
    return fixed
