"""Helpers of tests/workers/test_failures.py and tests/workers/test_bounds.py: drive runs attempt by attempt."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from runs.db import release_connection
from runs.engine import claim as claims
from runs.engine.claim import ClaimedRun
from runs.models import Event, Run
from tests.conftest import fresh
from tests.support.agents import LEDGER_TABLE
from tests.support.waiting import wait_until
from workers.executor import RunExecutor
from workers.host import RunControl
from workers.reaper import Reaper
from workers.worker import Worker, WorkerOptions


def burst_worker(**options) -> None:
    """An in-process worker that exits once nothing is claimable."""
    options = {
        "burst": True,
        "heartbeat": 1,
        "lease": 10,
        "listen": False,
        "concurrency": 4,
    } | options
    Worker(WorkerOptions(**options)).run()


def drive(runs: Iterable[Run], *, timeout: float = 20) -> list[Run]:
    """Burst workers, again and again, until no run is queued or running (backoffs are waited out)."""
    ids = [run.pk for run in runs]

    def settled() -> bool:
        burst_worker()
        return not Run.objects.filter(pk__in=ids, status__in=("queued", "running")).exists()

    wait_until(
        settled, timeout=timeout, interval=0.02, what="no run to be queued or running any more"
    )
    return [Run.objects.get(pk=pk) for pk in ids]


class Stepper:
    """Claims due runs and executes each attempt synchronously, as a worker's pool thread does.

    Unlike a worker loop, it lets a test read the state every attempt leaves
    behind (run_after, failures, error) before the next attempt overwrites it.
    """

    def __init__(self) -> None:
        # Never started: the executor only needs its id, lease, flags and hooks.
        self.worker = Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False))

    def claim(self, n: int = 50) -> list[ClaimedRun]:
        try:
            return claims.claim(
                worker_id=self.worker.id,
                queues=["default"],
                kinds=self.worker.kinds,
                n=n,
                lease=self.worker.lease,
            )
        finally:
            release_connection()

    def execute(self, claimed: ClaimedRun) -> str | None:
        return RunExecutor(self.worker, claimed, RunControl()).execute()

    def attempt(self, run: Run, *, timeout: float = 10) -> str | None:
        """Wait until ``run`` is claimable, claim it and execute one attempt; returns the status it left in."""
        [claimed] = wait_until(
            lambda: self.claim(n=1),
            timeout=timeout,
            interval=0.01,
            what=lambda: f"run {run.pk} to be claimable (it is {fresh(run).status})",
        )
        assert claimed.id == run.pk, "another run was claimed"
        return self.execute(claimed)


def exit_delay(run: Run) -> float:
    """Seconds between the run's last exit from running (its Event) and the run_after it set."""
    run = fresh(run)
    left = Event.objects.filter(run=run).latest("seq")
    assert left.type == "run.queued", left.type
    return (run.run_after - left.created_at).total_seconds()


def snapshot(run: Run) -> tuple:
    run = fresh(run)
    return (
        run.status,
        run.attempt,
        run.failures,
        run.error_kind,
        run.steps_done,
        run.lease_token,
        run.steps.count(),
        run.step_attempts.count(),
    )


def assert_left_alone(run: Run) -> None:
    """Neither the reaper nor a worker touches the run any more."""
    before = snapshot(run)
    report = Reaper().reap_once()
    assert (report.rescued, report.failed, report.deadline) == (0, 0, 0)
    burst_worker()
    assert snapshot(run) == before


def create_ledger() -> None:
    """The table of an idempotent callee: one row per effect, keyed by the idempotency key."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} "
            "(key text PRIMARY KEY, run_id text NOT NULL, pid integer NOT NULL, amount integer NOT NULL)"
        )


def ledger(run: Run) -> list[tuple[str, int]]:
    """The effects the callee made for the run: (key, pid of the process that made it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT key, pid FROM {LEDGER_TABLE} WHERE run_id = %s ORDER BY key", [str(run.pk)]
        )
        return cursor.fetchall()
