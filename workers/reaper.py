"""The reaper loop: rescues runs of dead workers, stops runs past their deadline, expires runs
nobody acted on, and keeps the tenant counters true. The transitions themselves are the run
domain's (``runs.engine.reaping``); this is when and how often.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from runs.db import notify_queues, release_connection
from runs.engine import reaping
from runs.engine.reaping import StaleLease

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

    def __str__(self) -> str:
        return (
            f"rescued={self.rescued} failed={self.failed} deadline={self.deadline} "
            f"expired={self.expired} tenants_fixed={self.tenants_fixed}"
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
            report.expired = reaping.expire_waiting(batch=self.batch)
            report.tenants_fixed = reaping.reconcile_tenants(queued=check_queued)
            if check_queued:
                self._queued_checked_at = time.monotonic()
            if requeued_queues:
                notify_queues(requeued_queues)
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
