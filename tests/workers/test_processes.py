"""Real worker and reaper processes against real PostgreSQL: kill them, stop them, race them."""

from __future__ import annotations

import signal
from collections import Counter

import pytest
from django.utils import timezone

from runs.models import Event, Run, Step, Tenant, Worker
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def step_started(log, run, seq):
    return any(r == str(run.id) and s == seq for r, s, _, _ in executions(log))


def test_two_workers_never_execute_the_same_step(tenant, processes, tmp_path):
    log = str(tmp_path / "exec.log")
    workers = [processes.worker("--concurrency", "4", "--poll", "0.2") for _ in range(2)]
    wait_until(
        lambda: Worker.objects.filter(stopped_at__isnull=True).count() == 2,
        what="both workers to register",
    )
    runs = [
        submit_run(
            tenant=tenant, kind="steps", input={"steps": 5, "log": log, "step_seconds": 0.01}
        )
        for _ in range(60)
    ]

    wait_until(
        lambda: Run.objects.filter(status="done").count() == len(runs),
        timeout=90,
        what="all runs done",
    )
    for proc in workers:
        proc.send_signal(signal.SIGTERM)
    for proc in workers:
        assert proc.wait(30) == 0, processes.output(proc)

    counts = Counter((run_id, seq) for run_id, seq, _, _ in executions(log))
    assert len(counts) == 60 * 5
    assert set(counts.values()) == {1}, [key for key, n in counts.items() if n > 1]
    # Both processes took part, so the runs really were contended for.
    assert len({pid for _, _, _, pid in executions(log)}) == 2
    assert Step.objects.filter(status="done").count() == 300
    assert set(Step.objects.values_list("executions", flat=True)) == {1}
    # Every slot went back (the last ones as the workers stopped); the workers' logs say why not.
    assert Tenant.objects.get(pk=tenant.pk).running == 0, "\n".join(
        processes.output(proc)[-4000:] for proc in workers
    )


def test_sigkill_in_step_7_of_9_resumes_elsewhere_without_repeating_steps_1_to_6(
    tenant, processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    run = submit_run(
        tenant=tenant,
        kind="steps",
        input={"steps": 9, "log": log, "block_at": 7, "block_file": str(block)},
    )
    first = processes.worker("--lease", "3", "--heartbeat", "1", "--poll", "0.2")
    wait_until(lambda: step_started(log, run, 7), what="step 7 to start")
    assert fresh(run).steps_done == 6

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    block.unlink()  # the next execution of step 7 does not block
    # Nobody heartbeats now; until the lease expires the run stays with the dead worker.
    assert fresh(run).status == "running"
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once")
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr
    run = fresh(run)
    assert (run.status, run.failures) == ("queued", 1)
    assert "stopped heartbeating" in run.error

    second = processes.worker("--burst")
    assert second.wait(60) == 0, processes.output(second)
    run = fresh(run)
    assert (run.status, run.attempt, run.steps_done) == ("done", 2, 9)
    # Done carries no error: the rescue is in its Events, not shown as why it stopped.
    assert (run.error, run.error_kind) == ("", "")
    assert Event.objects.filter(run=run, type="run.queued", actor_id="reaper").exists()
    per_step = Counter(seq for _, seq, _, _ in executions(log))
    assert per_step == {1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 2, 8: 1, 9: 1}
    pids = {seq: {pid for _, s, _, pid in executions(log) if s == seq} for seq in (1, 8)}
    assert pids[1] == {first.pid} and pids[8] == {second.pid}


def test_sigterm_releases_without_spending_an_attempt_and_the_next_worker_finishes(
    tenant, processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    run = submit_run(
        tenant=tenant,
        kind="steps",
        max_attempts=1,
        input={"steps": 4, "log": log, "block_at": 2, "block_file": str(block)},
    )
    first = processes.worker("--poll", "0.2")
    wait_until(lambda: step_started(log, run, 2), what="step 2 to start")

    first.send_signal(signal.SIGTERM)
    wait_until(
        lambda: "stopping: finishing in-flight steps" in processes.output(first),
        timeout=10,
        what="the worker to say it is stopping",
    )
    assert first.poll() is None, "the worker must let its in-flight step finish"
    block.unlink()  # the in-flight step finishes now
    assert first.wait(30) == 0, processes.output(first)
    run = fresh(run)
    assert (run.status, run.failures, run.steps_done, run.lease_token) == ("queued", 0, 2, None)
    assert Tenant.objects.get(pk=tenant.pk).running == 0

    second = processes.worker("--burst")
    assert second.wait(60) == 0, processes.output(second)
    run = fresh(run)
    assert (run.status, run.attempt, run.failures) == ("done", 2, 0)
    assert Counter(seq for _, seq, _, _ in executions(log)) == {1: 1, 2: 1, 3: 1, 4: 1}


def test_runs_waiting_on_slow_steps_hold_no_database_connection(tenant, processes, tmp_path):
    """40 runs in flight on a pool of 6 connections: only possible if a step holds none."""
    from django.db import connection

    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    runs = [
        submit_run(
            tenant=tenant,
            kind="steps",
            input={"steps": 2, "log": log, "block_at": 1, "block_file": str(block)},
        )
        for _ in range(40)
    ]
    worker = processes.worker("--concurrency", "40", RUNS_DB_POOL_MAX="6")

    def connections_in_use():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'agentruns runworker'"
            )
            return cursor.fetchone()[0]

    # Every run enters its first step, which waits (like a slow model call) until the file goes.
    wait_until(
        lambda: len(executions(log)) == 40, timeout=60, what="40 runs inside their first step"
    )
    # The pool (6) and the dedicated LISTEN connection, and at least the listener.
    assert 1 <= connections_in_use() <= 7
    block.unlink()
    wait_until(
        lambda: Run.objects.filter(status="done").count() == len(runs),
        timeout=60,
        what="all runs done",
    )
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, processes.output(worker)
