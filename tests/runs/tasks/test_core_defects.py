"""Defects found by porting Django's task tests to this backend (issue 26), checked on real ``runworker`` processes.

- A step, a kind or a task that raises ``SystemExit`` or ``KeyboardInterrupt``
  (or calls ``exit()``) fails its run at once with that error, and the
  worker goes on with its other runs (workers.classify, workers.executor).
- Runs enqueued together with equal priority, due at the same moment, start
  in the order they were enqueued (the claim index orders them by created_at).
- A deferred task reads back the ``run_after`` it was enqueued with.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from uuid import UUID

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus
from django.utils import timezone

from runs.models import Run, StepAttempt
from runs.services import submit_run
from tests.support import agents_core
from tests.support import django_tasks as tasks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = (
    os.environ.get("AGENT_MODULES", "tests.support.agents")
    + ",tests.support.django_tasks,tests.support.agents_core"
)
ENV = {
    "AGENT_MODULES": MODULES,
    "RUNS_BACKOFF_BASE_SECONDS": "0.05",
    "RUNS_BACKOFF_CAP_SECONDS": "0.2",
}


def signals(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.parametrize("how", list(agents_core.SHOWN_AS))
def test_code_that_exits_fails_its_run_and_the_worker_carries_on(processes, tmp_path, tenant, how):
    log = tmp_path / "signals"
    worker = processes.worker(
        "--poll", "0.1", "--concurrency", "1", TASK_SIGNAL_LOG=str(log), **ENV
    )
    in_task = agents_core.exits.enqueue(how)
    in_step = submit_run(tenant=tenant, kind="exits_in_step", input={"how": how})
    between = submit_run(tenant=tenant, kind="exits_between_steps", input={"how": how})
    ids = [UUID(in_task.id), in_step.pk, between.pk]

    wait_until(
        lambda: Run.objects.filter(pk__in=ids, status="failed").count() == 3,
        timeout=60,
        what=f"the three runs to fail\n{processes.output(worker)}",
    )
    shown = agents_core.SHOWN_AS[how]
    runs = {run.pk: run for run in Run.objects.filter(pk__in=ids)}
    for run in runs.values():
        # Failed for good on its first attempt: neither left running for the reaper nor retried.
        assert (run.attempt, run.error_kind, run.failures) == (1, "fatal", 0), run.error
    assert runs[in_step.pk].error.startswith(f"step 2 (leave): {shown} raised by the step: "), runs[
        in_step.pk
    ].error
    assert "cannot stop the worker process" in runs[in_step.pk].error
    assert runs[between.pk].error.startswith(f"{shown} raised by the kind's code between steps"), (
        runs[between.pk].error
    )
    assert runs[UUID(in_task.id)].error.startswith(f"step 1 (exits): {shown} raised by the step")
    # The step's own record keeps the exception and where it was raised.
    [attempt] = StepAttempt.objects.filter(run_id=in_step.pk)
    assert attempt.error_kind == "fatal" and "Traceback (most recent call last)" in attempt.error
    assert "in leave" in attempt.error

    result = agents_core.exits.get_result(in_task.id)
    assert (result.status, result.attempts) == (TaskResultStatus.FAILED, 1)
    [error] = result.errors
    expected_class = (
        "builtins.KeyboardInterrupt" if how == "KeyboardInterrupt" else "builtins.SystemExit"
    )
    assert error.exception_class_path == expected_class
    wait_until(
        lambda: any(e["signal"] == "finished" and e["id"] == in_task.id for e in signals(log)),
        what="task_finished",
    )
    [finished] = [e for e in signals(log) if e["signal"] == "finished" and e["id"] == in_task.id]
    assert finished["status"] == "FAILED" and finished["pid"] == worker.pid

    # The same process goes on: it runs the next task to the end.
    assert worker.poll() is None, processes.output(worker)
    after = tasks.add.enqueue(2, 3)
    wait_until(
        lambda: tasks.add.get_result(after.id).status == TaskResultStatus.SUCCESSFUL,
        timeout=30,
        what=f"the worker to run another task\n{processes.output(worker)}",
    )
    assert worker.poll() is None
    assert "executor crashed" not in processes.output(worker)

    # A real SIGINT to the process is still its graceful shutdown.
    worker.send_signal(signal.SIGINT)
    assert worker.wait(30) == 0, processes.output(worker)
    assert "stopped" in processes.output(worker)


def test_runs_enqueued_together_start_in_the_order_they_were_enqueued(processes, tmp_path):
    order = tmp_path / "order"
    # Due at the same moment (each enqueue without run_after would get its statement's own now()).
    note = agents_core.note.using(run_after=timezone.now())
    with transaction.atomic():
        enqueued = [note.enqueue(str(order), str(n)) for n in range(30)]
    runs = Run.objects.filter(pk__in=[result.id for result in enqueued])
    assert (
        len({(run.priority, run.run_after) for run in runs}) == 1
    )  # nothing but the tie-break tells them apart
    worker = processes.worker("--burst", "--poll", "0.1", "--concurrency", "1", **ENV)
    assert worker.wait(120) == 0, processes.output(worker)
    assert order.read_text().split() == [str(n) for n in range(30)]


def test_a_deferred_task_reads_back_its_run_after(processes):
    when = timezone.now() + timedelta(seconds=2, microseconds=123456)
    later = tasks.add.using(run_after=when).enqueue(1, 2)
    now = tasks.add.enqueue(3, 4)
    assert tasks.add.get_result(later.id).task.run_after == when
    assert tasks.add.get_result(now.id).task.run_after is None

    wait_until(lambda: timezone.now() > when, timeout=10, what="run_after to pass")
    worker = processes.worker("--burst", "--poll", "0.1", **ENV)
    assert worker.wait(90) == 0, processes.output(worker)
    ran = tasks.add.get_result(later.id)
    assert (ran.status, ran.return_value) == (TaskResultStatus.SUCCESSFUL, 3)
    assert ran.task.run_after == when  # after it started and finished too
    assert tasks.add.get_result(now.id).task.run_after is None


@pytest.mark.parametrize("exc", [SystemExit(3), SystemExit(), KeyboardInterrupt(), GeneratorExit()])
def test_exiting_is_classified_fatal_with_a_readable_reason(exc):
    from workers.classify import classify, interruption

    found = classify(exc)
    assert (found.kind, found.retry_after, found.uncertain) == ("fatal", None, False)
    assert interruption(exc, by="the step").startswith(f"{exc!r} raised by the step: ")
    assert interruption(ValueError("x"), by="the step") is None
