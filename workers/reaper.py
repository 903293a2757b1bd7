"""The reaper loop: rescues runs of dead workers, stops runs past their deadline, expires runs
nobody acted on, keeps the tenant counters true, and deletes runs past retention. The
transitions themselves are the run domain's (``runs.engine.reaping``, ``runs.engine.retention``);
this is when and how often.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings

from runs import schedules
from runs.control import cancel_runs
from runs.db import notify_control, notify_queues, release_connection
from runs.engine import family, keys, limits, ratelimits, reaping, retention, timers
from runs.engine.reaping import StaleLease
from runs.metrics.publish import retire_silent

logger = logging.getLogger(__name__)

# Every tenant's queued counter (approximate, for backpressure) is checked
# this often; the running counters on every pass.
QUEUED_RECONCILE_SECONDS = 60.0


@dataclass
class ReapReport:
    rescued: int = 0
    failed: int = 0
    deadline: int = 0
    expired: int = 0
    tenants_fixed: int = 0
    orphans: int = 0
    released: int = 0  # held runs of concurrency keys queued by the reaper's pass
    limits_fixed: int = 0  # kinds' and queues' running counters set to the truth
    scheduled: int = 0  # runs submitted by schedules
    missed: int = 0  # schedules' fire times that made no run

    def __str__(self) -> str:
        return (
            f"rescued={self.rescued} failed={self.failed} deadline={self.deadline} "
            f"expired={self.expired} tenants_fixed={self.tenants_fixed} orphans={self.orphans} "
            f"released={self.released} limits_fixed={self.limits_fixed} "
            f"scheduled={self.scheduled} missed={self.missed}"
        )


class Reaper:
    def __init__(self, *, batch: int = 500):
        self.batch = batch
        self.stopping = threading.Event()
        self._queued_checked_at = float("-inf")

    def find_expired(self) -> list[StaleLease]:
        return reaping.find_expired_leases(limit=self.batch)

    def rescue(self, stale: StaleLease) -> str | None:
        return reaping.rescue(stale)

    def find_past_deadline(self) -> list[StaleLease]:
        return reaping.find_past_deadline(limit=self.batch)

    def reconcile_tenants(self, *, queued: bool = True) -> int:
        """Set the tenants' counters to the truth now (both counters unless ``queued`` is False)."""
        return reaping.reconcile_tenants(queued=queued)

    def reap_once(self) -> ReapReport:
        report = ReapReport()
        requeued_queues: set[str] = set()
        check_queued = time.monotonic() - self._queued_checked_at >= QUEUED_RECONCILE_SECONDS
        try:
            for stale in self.find_expired():
                status = self.rescue(stale)
                if status == "queued":
                    report.rescued += 1
                    requeued_queues.add(stale.queue)
                elif status is not None:
                    report.failed += 1
            for stale in self.find_past_deadline():
                if reaping.stop_past_deadline(stale):
                    report.deadline += 1
            if report.deadline:
                # Their workers are alive (their heartbeat keeps only the worker's lease):
                # told now, they read the runs they hold and stop these (runs.engine.claim.heartbeat).
                notify_control()
            report.expired = reaping.expire_waiting(batch=self.batch)
            report.expired += reaping.expire_unstarted(batch=self.batch)
            # Schedules whose fire time has come (runs.schedules), once per fire time.
            fired = schedules.fire_due(batch=self.batch)
            report.scheduled, report.missed = fired.fired, fired.missed
            ratelimits.prune()  # reservations older than any rate limit's window
            # Concurrency keys whose holder ended without its release (runs.engine.keys).
            report.released = keys.release_stuck(batch=self.batch)
            # Children of runs that failed or were cancelled, when the cascade
            # of their parent's exit did not happen (its worker died, the
            # reaper failed it): cancelled now.
            report.orphans = cancel_runs(family.orphaned_children(batch=self.batch))
            report.tenants_fixed = reaping.reconcile_tenants(queued=check_queued)
            report.limits_fixed = limits.reconcile()  # the kinds' and queues' global counters
            # Metric rows of processes long gone, folded into one (their counts are kept).
            retire_silent()
            if check_queued:
                self._queued_checked_at = time.monotonic()
            if requeued_queues:
                notify_queues(requeued_queues)
        finally:
            release_connection()
        if (
            report.rescued
            or report.failed
            or report.deadline
            or report.expired
            or report.tenants_fixed
            or report.orphans
            or report.released
            or report.limits_fixed
            or report.scheduled
            or report.missed
        ):
            logger.info("reaped: %s", report)
        return report

    def wake_timers(self) -> int:
        """Queue the waiting runs whose timer is due (``wait_for_message`` and ``gather`` timeouts)."""
        try:
            return timers.wake_due(batch=self.batch)
        finally:
            release_connection()

    def prune(self) -> int:
        """Delete runs finished more than ``RUNS_RETENTION_DAYS`` ago (0: none), batch by batch; returns how many.

        Batches of ``RUNS_RETENTION_BATCH`` runs with ``RUNS_RETENTION_PAUSE_SECONDS``
        between them, until a batch comes back short (nothing more is due) or
        ``RUNS_RETENTION_MAX_SECONDS`` of work, so rescues never wait long
        behind a backlog: the next pass goes on with it. Stopping the reaper
        stops it between batches.
        """
        days = settings.RUNS_RETENTION_DAYS
        if days <= 0:
            return 0
        size = max(1, settings.RUNS_RETENTION_BATCH)
        started = time.monotonic()
        total = retention.PruneBatch()
        more = True
        while True:
            try:
                batch = retention.prune_finished(older_than=timedelta(days=days), batch=size)
            finally:
                release_connection()
            total += batch
            more = batch.runs >= size
            if not more or time.monotonic() - started >= settings.RUNS_RETENTION_MAX_SECONDS:
                break
            if self.stopping.wait(settings.RUNS_RETENTION_PAUSE_SECONDS):
                break
        if total.runs:
            logger.info(
                "pruned runs finished over %g days ago in %.1fs%s: %s",
                days,
                time.monotonic() - started,
                " (more are due)" if more else "",
                total,
            )
        return total.runs

    def run(self, *, interval: float, timer_interval: float = 1.0) -> None:
        """A full pass every ``interval`` seconds, due timers every ``timer_interval``, and
        a retention pass every ``RUNS_RETENTION_INTERVAL_SECONDS``."""
        next_pass = 0.0
        next_prune = 0.0
        while not self.stopping.is_set():
            if time.monotonic() >= next_pass:
                try:
                    self.reap_once()
                except Exception:
                    logger.exception("reap pass failed")
                next_pass = time.monotonic() + interval
            if time.monotonic() >= next_prune and not self.stopping.is_set():
                try:
                    self.prune()
                except Exception:
                    logger.exception("retention pass failed")
                next_prune = time.monotonic() + settings.RUNS_RETENTION_INTERVAL_SECONDS
            try:
                self.wake_timers()
            except Exception:
                logger.exception("waking due timers failed")
            self.stopping.wait(max(0.0, min(timer_interval, next_pass - time.monotonic())))
