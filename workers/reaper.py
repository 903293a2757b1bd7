"""The reaper: rescues runs of dead workers and keeps the tenant counters true.

Every write is fenced: a rescue matches only the lease token it read and
only while that lease is still expired, so a run that finished or was
claimed again between the read and the write is left alone.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from uuid import UUID

from django.db import connection, transaction

from workers import queue
from workers.queue import release_connection

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StaleLease:
    run_id: UUID
    token: int
    queue: str


@dataclass
class ReapReport:
    rescued: int = 0
    failed: int = 0
    deadline: int = 0
    expired: int = 0
    tenants_fixed: int = 0

    def __str__(self) -> str:
        return (
            f"rescued={self.rescued} failed={self.failed} deadline={self.deadline} "
            f"expired={self.expired} tenants_fixed={self.tenants_fixed}"
        )


# Runs waiting on people (or paused) past expires_at fail as `expired`, in
# one statement per batch with their Events; they hold no slot to give back.
_EXPIRE_SQL = """
WITH r AS (
    UPDATE runs_run SET status = 'failed', error_kind = 'expired',
        error = 'nobody acted on this run before it expired (expires_at)',
        finished_at = statement_timestamp(), updated_at = statement_timestamp(),
        last_event_seq = last_event_seq + 1
    WHERE id IN (
        SELECT id FROM runs_run
        WHERE status IN ('waiting_human', 'waiting', 'paused') AND expires_at < statement_timestamp()
        LIMIT %(batch)s FOR UPDATE SKIP LOCKED
    )
    AND status IN ('waiting_human', 'waiting', 'paused') AND expires_at < statement_timestamp()
    RETURNING id, last_event_seq
)
INSERT INTO runs_event (run_id, seq, type, actor_type, actor_id, payload, created_at)
SELECT id, last_event_seq, 'run.failed', 'system', 'reaper',
       jsonb_build_object('reason', 'expired', 'error_kind', 'expired'), statement_timestamp()
FROM r
"""


_COUNTS_SQL = """
WITH c AS (
    SELECT tenant_id, count(*) FILTER (WHERE status = 'running') AS running,
           count(*) FILTER (WHERE status = 'queued') AS queued
    FROM runs_run WHERE status IN ('running', 'queued') GROUP BY tenant_id
)"""


class Reaper:
    def __init__(self, *, batch: int = 500):
        self.batch = batch
        self.stopping = threading.Event()

    def find_expired(self) -> list[StaleLease]:
        """Running runs whose lease has expired (uses the partial index on running runs)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, lease_token, queue FROM runs_run"
                " WHERE status = 'running' AND locked_until < statement_timestamp() ORDER BY locked_until LIMIT %s",
                [self.batch],
            )
            return [StaleLease(*row) for row in cursor.fetchall()]

    def rescue(self, stale: StaleLease) -> str | None:
        """Return one expired run to the queue (a failed attempt), or fail it when its budget is spent.

        Returns the status reached, or None when the run was no longer the
        one read (finished, re-claimed or heartbeated meanwhile).
        """
        outcome = queue.leave_running(
            run_id=stale.run_id,
            token=stale.token,
            target="queued",
            reason="lease_expired",
            actor_type="system",
            actor_id="reaper",
            error="the worker holding this run stopped heartbeating (lease expired)",
            add_failure=True,
            only_if_expired=True,
        )
        return None if outcome is None else outcome[0]

    def find_past_deadline(self) -> list[StaleLease]:
        """Running runs (alive or not) whose running time is past their deadline."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, lease_token, queue FROM runs_run WHERE status = 'running'"
                " AND running_seconds + EXTRACT(EPOCH FROM statement_timestamp() - claimed_at) > deadline_seconds"
                " LIMIT %s",
                [self.batch],
            )
            return [StaleLease(*row) for row in cursor.fetchall()]

    def stop_past_deadline(self, stale: StaleLease) -> bool:
        """Fail a run past its deadline, fenced on the lease token read; its worker then finds its lease lost."""
        outcome = queue.leave_running(
            run_id=stale.run_id,
            token=stale.token,
            target="failed",
            reason="deadline",
            actor_type="system",
            actor_id="reaper",
            error="the run used up its running time (deadline); stopped by the reaper",
            error_kind="deadline",
        )
        return outcome is not None

    def expire_waiting(self) -> int:
        with connection.cursor() as cursor:
            cursor.execute(_EXPIRE_SQL, {"batch": self.batch})
            return cursor.rowcount

    def reconcile_tenants(self) -> int:
        """Set each tenant's running and queued counters to the truth, under the tenant row's lock."""
        fixed = 0
        with connection.cursor() as cursor:
            cursor.execute(_COUNTS_SQL + " SELECT t.id FROM runs_tenant t LEFT JOIN c ON c.tenant_id = t.id"
                           " WHERE t.running <> COALESCE(c.running, 0) OR t.queued <> COALESCE(c.queued, 0)")
            suspects = [row[0] for row in cursor.fetchall()]
        for tenant_id in suspects:
            # The row lock waits for claims and exits in flight to commit;
            # the count after it (a new snapshot) then sees them all.
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM runs_tenant WHERE id = %s FOR UPDATE", [tenant_id])
                cursor.execute(
                    "UPDATE runs_tenant t SET running = c.running, queued = c.queued FROM ("
                    "  SELECT count(*) FILTER (WHERE status = 'running') AS running,"
                    "         count(*) FILTER (WHERE status = 'queued') AS queued"
                    "  FROM runs_run WHERE tenant_id = %s AND status IN ('running', 'queued')"
                    ") c WHERE t.id = %s AND (t.running <> c.running OR t.queued <> c.queued)",
                    [tenant_id, tenant_id],
                )
                if cursor.rowcount:
                    fixed += 1
                    logger.info("tenant %s counters reconciled", tenant_id)
        return fixed

    def reap_once(self) -> ReapReport:
        report = ReapReport()
        requeued_queues: set[str] = set()
        try:
            for stale in self.find_expired():
                status = self.rescue(stale)
                if status == "queued":
                    report.rescued += 1
                    requeued_queues.add(stale.queue)
                elif status is not None:
                    report.failed += 1
            for stale in self.find_past_deadline():
                if self.stop_past_deadline(stale):
                    report.deadline += 1
            report.expired = self.expire_waiting()
            report.tenants_fixed = self.reconcile_tenants()
            if requeued_queues:
                queue.notify_queues(requeued_queues)
        finally:
            release_connection()
        if report.rescued or report.failed or report.deadline or report.expired or report.tenants_fixed:
            logger.info("reaped: %s", report)
        return report

    def run(self, *, interval: float) -> None:
        while not self.stopping.is_set():
            try:
                self.reap_once()
            except Exception:
                logger.exception("reap pass failed")
            self.stopping.wait(interval)
