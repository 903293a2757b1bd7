"""The reaper's transitions: rescue expired leases, stop runs past their deadline, expire waiting runs,
and keep the tenant counters true.

Every write is fenced: a rescue matches only the lease token it read and
only while that lease is still expired, so a run that finished or was
claimed again between the read and the write is left alone. Every read is
bounded: by a batch size on the running-runs index, or by the tenant's own
limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from django.db import connection, transaction

from runs.db import sql
from runs.engine import family
from runs.engine.exit import Exit, leave
from runs.events import event_ctes, next_seq
from runs.metrics import process as metrics
from runs.states import RunStatus


@dataclass(frozen=True)
class StaleLease:
    run_id: UUID
    token: int
    queue: str
    parent_id: UUID | None = None


_EXPIRED_LEASES_SQL = sql(
    "SELECT id, lease_token, queue, parent_id FROM runs_run"
    " WHERE status = {running} AND locked_until < statement_timestamp() ORDER BY locked_until LIMIT %s"
)


def find_expired_leases(*, limit: int) -> list[StaleLease]:
    """Running runs whose lease has expired (on the partial index of running runs)."""
    with connection.cursor() as cursor:
        cursor.execute(_EXPIRED_LEASES_SQL, [limit])
        return [StaleLease(*row) for row in cursor.fetchall()]


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
            stale.run_id, stale.token, parent=stale.parent_id
        )
    )
    if outcome is None:
        return None
    if reason == "lease_expired":
        metrics.lease_rescued(queue=outcome.queue, status=outcome.status)
    return outcome.status


_PAST_DEADLINE_SQL = sql(
    "SELECT id, lease_token, queue, parent_id FROM runs_run WHERE status = {running}"
    " AND compensation <> 'running'"  # a rollback runs to its end (runs.engine.saga)
    " AND running_seconds + EXTRACT(EPOCH FROM statement_timestamp() - claimed_at) > deadline_seconds"
    " LIMIT %s"
)


def find_past_deadline(*, limit: int) -> list[StaleLease]:
    """Running runs (alive or not) whose running time is past their deadline."""
    with connection.cursor() as cursor:
        cursor.execute(_PAST_DEADLINE_SQL, [limit])
        return [StaleLease(*row) for row in cursor.fetchall()]


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
            actor_type="system",
            actor_id="reaper",
        )
    )
    return outcome is not None


# Runs waiting on people (or paused) past expires_at fail as `expired`, in
# one statement per batch with their Events; they hold no slot to give back.
# A run someone else has locked is skipped (left to the next pass): never
# waiting on a row, the batch needs no id order to be deadlock-free.
_EXPIRE_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET status = {failed}, error_kind = 'expired',
        error = 'nobody acted on this run before it expired (expires_at)',
        finished_at = statement_timestamp(), updated_at = statement_timestamp(),
        {next_seq}
    WHERE id IN (
        SELECT id FROM runs_run
        WHERE status IN {parked} AND expires_at < statement_timestamp()
          -- Child runs one at a time (expire_waiting), each with its parent's wake-up.
          AND (CASE WHEN %(only)s::uuid IS NULL THEN parent_id IS NULL ELSE id = %(only)s::uuid END)
        LIMIT %(batch)s FOR NO KEY UPDATE SKIP LOCKED
    )
    AND status IN {parked} AND expires_at < statement_timestamp()
    RETURNING id, last_event_seq, queue, kind
),
{events}
SELECT queue, kind FROM r
""",
    next_seq=next_seq(),
    events=event_ctes(
        "r",
        type="'run.failed'",
        actor_type="'system'",
        actor_id="'reaper'",
        payload="jsonb_build_object('reason', 'expired', 'error_kind', 'expired')",
    ),
)


_EXPIRED_CHILDREN_SQL = sql(
    "SELECT id, parent_id FROM runs_run WHERE status IN {parked} AND expires_at < statement_timestamp()"
    " AND parent_id IS NOT NULL LIMIT %s"
)


def expire_waiting(*, batch: int) -> int:
    """Fail up to ``batch`` runs that waited for people past their ``expires_at``; returns how many.

    Their children are cancelled by the reaper's sweep of orphans
    (``family.orphaned_children``); an expired child wakes its parent.
    """
    with connection.cursor() as cursor:
        cursor.execute(_EXPIRE_SQL, {"batch": batch, "only": None})
        rows = cursor.fetchall()
        cursor.execute(_EXPIRED_CHILDREN_SQL, [batch])
        children = cursor.fetchall()
    for child_id, parent_id in children:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(_EXPIRE_SQL, {"batch": 1, "only": child_id})
            row = cursor.fetchone()
            if row:
                rows.append(row)
                family.wake_after_commit(
                    family.child_finished(child_id=child_id, parent_id=parent_id, succeeded=False)
                )
    for queue, kind in rows:
        metrics.run_finished(queue=queue, kind=kind, status=RunStatus.FAILED)
    return len(rows)


# Tenants whose running counter disagrees with their running runs: the
# running runs are few (the partial index on running runs), so this read is
# bounded by what runs, never by what is queued.
_RUNNING_SUSPECTS_SQL = sql("""
WITH c AS (SELECT tenant_id, count(*) AS n FROM runs_run WHERE status = {running} GROUP BY tenant_id)
SELECT t.id FROM runs_tenant t LEFT JOIN c ON c.tenant_id = t.id
WHERE t.running <> COALESCE(c.n, 0)
""")

# The running counter is set to the count of running runs, and the time of
# that count is kept: slots workers give back later count only for runs
# that left running after it (runs.engine.claim), since the count already
# left out those that had left before. clock_timestamp(), evaluated after
# the statement took its snapshot, so that no run counted as gone left
# after it. The queued counter is approximate (backpressure only): counted
# up to the tenant's max_queued + 1 on the claim index, never past it.
_FIX_SQL = sql("""
UPDATE runs_tenant t SET running = c.running,
    running_reconciled_at = CASE WHEN t.running <> c.running THEN clock_timestamp() ELSE t.running_reconciled_at END,
    queued = CASE WHEN %(queued)s THEN c.queued ELSE t.queued END
FROM (
    SELECT (SELECT count(*) FROM runs_run WHERE tenant_id = %(tenant)s AND status = {running}) AS running,
           (SELECT count(*) FROM (SELECT 1 FROM runs_run WHERE tenant_id = %(tenant)s AND status = {queued}
                                  LIMIT (SELECT max_queued + 1 FROM runs_tenant WHERE id = %(tenant)s)) q)
               AS queued
) c
WHERE t.id = %(tenant)s
  AND (t.running <> c.running
       OR %(queued)s AND t.queued <> c.queued AND (t.queued <= t.max_queued OR c.queued <= t.max_queued))
""")


def reconcile_tenants(*, queued: bool) -> int:
    """Set tenants' counters to the truth, each under its row's lock; returns how many were fixed.

    ``running`` is checked on every call; with ``queued`` every tenant's
    queued counter is checked too (a bounded count per tenant), which the
    reaper does less often.
    """
    with connection.cursor() as cursor:
        if queued:
            cursor.execute("SELECT id FROM runs_tenant ORDER BY id")
        else:
            cursor.execute(_RUNNING_SUSPECTS_SQL)
        suspects = [row[0] for row in cursor.fetchall()]
    fixed = 0
    for tenant_id in suspects:
        # The row lock waits for claims and exits in flight to commit (both
        # write the tenant row in the statement that changes the run); the
        # counts after it, in a new snapshot, then see them all.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM runs_tenant WHERE id = %s FOR UPDATE", [tenant_id])
            cursor.execute(_FIX_SQL, {"tenant": tenant_id, "queued": queued})
            fixed += cursor.rowcount
    return fixed
