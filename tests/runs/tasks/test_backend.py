"""Django's task API on this engine (runs.tasks), driven only through Django's public API.

Tasks are enqueued with ``Task.enqueue`` / ``aenqueue`` / ``using(...)``,
read back with ``get_result`` / ``aget_result``, and run by real
``runworker`` processes; the database and the dashboard are only looked
at, to check that a task is a run like any other.
"""

from __future__ import annotations

import json
import os
import signal
from datetime import timedelta
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.tasks import TaskResultStatus, default_task_backend, task_backends
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist, TaskResultMismatch
from django.tasks.signals import task_enqueued
from django.test import Client
from django.utils import timezone

from runs import submit_run
from runs.models import Run, StepAttempt
from tests.support import django_tasks as tasks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MODULES = os.environ.get("AGENT_MODULES", "tests.support.agents") + ",tests.support.django_tasks"
FAST = {
    "AGENT_MODULES": MODULES,
    "RUNS_BACKOFF_BASE_SECONDS": "0.05",
    "RUNS_BACKOFF_CAP_SECONDS": "0.2",
}


def drain(processes, *args: str, **env) -> str:
    """A burst worker that runs every claimable task, then exits; returns its log."""
    worker = processes.worker("--burst", "--poll", "0.1", *args, **(FAST | env))
    assert worker.wait(90) == 0, processes.output(worker)
    return processes.output(worker)


def drain_until_finished(processes, result) -> None:
    """Burst workers until the task finished: a burst worker exits while a retry waits out its backoff."""
    for _ in range(10):
        drain(processes)
        result.refresh()
        if result.is_finished:
            return
    pytest.fail(f"the task is still {result.status}")


def signals(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_backend_says_what_it_supports():
    backend = task_backends["default"]
    assert type(backend).__name__ == "DurableTaskBackend"
    assert (
        backend.supports_defer,
        backend.supports_priority,
        backend.supports_get_result,
        backend.supports_async_task,
    ) == (True, True, True, True)


def test_an_enqueued_task_runs_on_a_worker_and_its_result_reads_back(processes):
    enqueued = []
    task_enqueued.connect(
        receiver := lambda sender, task_result, **kw: enqueued.append(task_result), weak=False
    )
    try:
        result = tasks.add.enqueue(2, b=40)
    finally:
        task_enqueued.disconnect(receiver)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs, result.backend) == ([2], {"b": 40}, "default")
    assert [r.id for r in enqueued] == [result.id]
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018 - the property raises

    ready = tasks.add.get_result(result.id)
    assert (ready.status, ready.enqueued_at, ready.started_at, ready.worker_ids) == (
        TaskResultStatus.READY,
        result.enqueued_at,
        None,
        [],
    )

    drain(processes)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42
    assert result.enqueued_at <= result.started_at <= result.last_attempted_at <= result.finished_at
    assert result.attempts == 1 and len(result.worker_ids) == 1
    assert result.errors == []
    # A run like any other: its kind is the function's dotted path, one step named after it.
    run = Run.objects.get(pk=result.id)
    assert (run.kind, run.status, run.result, run.title) == (
        "tests.support.django_tasks.add",
        "done",
        42,
        "add(2, b=40)",
    )
    assert [(s.name, s.status, s.executions) for s in run.steps.all()] == [("add", "done", 1)]


def test_async_task_and_the_async_api(processes):
    result = async_to_sync(tasks.double_later.aenqueue)(21)
    drain(processes)
    fetched = async_to_sync(tasks.double_later.aget_result)(result.id)
    assert (fetched.status, fetched.return_value) == (TaskResultStatus.SUCCESSFUL, 42)
    async_to_sync(result.arefresh)()
    assert result.return_value == 42


def test_takes_context_sees_its_own_result_and_attempt(processes):
    result = tasks.introspect.enqueue(7)
    drain(processes)
    result.refresh()
    seen = result.return_value
    assert seen["id"] == result.id and seen["x"] == 7
    assert (seen["attempt"], seen["status"]) == (1, "RUNNING")
    assert seen["workers"] == result.worker_ids


def test_higher_django_priority_runs_first(processes, tmp_path):
    order = tmp_path / "order"
    for priority in (-100, -10, 0, 10, 100):
        tasks.record.using(priority=priority).enqueue(str(order), str(priority))
    drain(processes, "--concurrency", "1")
    assert order.read_text().split() == ["100", "10", "0", "-10", "-100"]
    # Read back by band (runs.tasks.results): 100 stays 100, 10 comes back as 20.
    priorities = sorted(
        r.task.priority for r in (tasks.record.get_result(run.pk) for run in Run.objects.all())
    )
    assert priorities == [-100, -25, 0, 20, 100]


def test_queue_name_is_the_runs_queue(processes):
    result = tasks.elsewhere.enqueue()
    also = tasks.add.using(queue_name="tasks-other").enqueue(1, 1)
    drain(processes)  # the default queue only
    assert tasks.elsewhere.get_result(result.id).status == TaskResultStatus.READY
    assert tasks.add.get_result(also.id).status == TaskResultStatus.READY
    drain(processes, "--queues", "tasks-other")
    assert tasks.elsewhere.get_result(result.id).return_value == "ran on tasks-other"
    assert tasks.add.get_result(also.id).return_value == 2
    assert Run.objects.get(pk=also.id).queue == "tasks-other"


def test_run_after_defers_a_task(processes):
    later = tasks.add.using(run_after=timezone.now() + timedelta(seconds=3)).enqueue(1, 2)
    now = tasks.add.enqueue(3, 4)
    drain(processes)
    assert tasks.add.get_result(now.id).status == TaskResultStatus.SUCCESSFUL
    assert tasks.add.get_result(later.id).status == TaskResultStatus.READY
    wait_until(
        lambda: Run.objects.get(pk=later.id).run_after <= timezone.now(),
        timeout=10,
        what="run_after",
    )
    drain(processes)
    result = tasks.add.get_result(later.id)
    assert result.return_value == 3
    assert result.started_at >= result.enqueued_at + timedelta(seconds=2.5)


def test_a_failing_task_is_failed_with_its_error_and_traceback(processes):
    result = tasks.refuse.enqueue("no route to the moon")
    drain(processes)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018 - the property raises
    [error] = result.errors
    assert error.exception_class_path == "tests.support.django_tasks.Unreachable"
    assert error.exception_class is tasks.Unreachable
    assert (
        "no route to the moon" in error.traceback
        and "Traceback (most recent call last)" in error.traceback
    )
    assert result.attempts == 1  # not a transient error: not retried


def test_a_value_json_cannot_hold_fails_the_task(processes):
    result = tasks.unserialisable.enqueue()
    drain(processes)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class_path == "builtins.TypeError"


def test_a_transient_error_is_retried_with_backoff(processes, tmp_path):
    marker = tmp_path / "flaky"
    result = tasks.flaky.enqueue(str(marker))
    drain_until_finished(processes, result)
    assert (result.status, result.return_value, result.attempts) == (
        TaskResultStatus.SUCCESSFUL,
        "sent",
        2,
    )
    [error] = result.errors
    assert error.exception_class_path == "builtins.ConnectionRefusedError"
    assert "refused the connection" in error.traceback


def test_django_task_signals_fire_in_the_worker(processes, tmp_path):
    log = tmp_path / "signals"
    ok = tasks.add.enqueue(1, 1)
    bad = tasks.refuse.enqueue("nope")
    drain(processes, TASK_SIGNAL_LOG=str(log))
    seen = [
        (entry["signal"], entry["id"], entry["status"], entry["sender"]) for entry in signals(log)
    ]
    assert sorted(seen) == sorted(
        [
            ("started", ok.id, "RUNNING", "DurableTaskBackend"),
            ("finished", ok.id, "SUCCESSFUL", "DurableTaskBackend"),
            ("started", bad.id, "RUNNING", "DurableTaskBackend"),
            ("finished", bad.id, "FAILED", "DurableTaskBackend"),
        ]
    )
    assert {entry["pid"] for entry in signals(log)} != {os.getpid()}
    # finished comes after the exit committed: the result it carried is what get_result says now.
    finished = next(e for e in signals(log) if e["signal"] == "finished" and e["id"] == ok.id)
    assert tasks.add.get_result(ok.id).finished_at <= timezone.datetime.fromisoformat(
        finished["at"]
    )


def test_a_task_survives_a_killed_worker(processes, tmp_path):
    marker = tmp_path / "stalled"
    result = tasks.stall_once.enqueue(str(marker))
    first = processes.worker("--lease", "3", "--heartbeat", "1", "--poll", "0.1", **FAST)
    wait_until(marker.exists, timeout=30, what="the task to start")
    assert tasks.stall_once.get_result(result.id).status == TaskResultStatus.RUNNING
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    wait_until(
        lambda: Run.objects.get(pk=result.id).locked_until < timezone.now(),
        timeout=10,
        what="the lease to expire",
    )
    reaped = processes.run("reap", "--once", **FAST)
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr
    assert tasks.stall_once.get_result(result.id).status == TaskResultStatus.READY

    drain(processes)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value.startswith("finished by ")
    assert result.return_value != f"finished by {marker.read_text()}"  # another process finished it
    assert result.attempts == 2 and len(set(result.worker_ids)) == 2


def test_get_result_refuses_what_is_not_one_of_its_tasks(tenant):
    for bogus in ("not-a-uuid", "00000000-0000-0000-0000-000000000000", "\x00"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(bogus)
    agent_run = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result(str(agent_run.pk))
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.record.get_result(result.id)


def test_what_django_or_the_engine_cannot_take_is_refused_before_anything_is_written():
    with pytest.raises(InvalidTask, match="priority"):
        tasks.add.using(priority=101)
    with pytest.raises(InvalidTask, match="aware"):
        tasks.add.using(run_after=timezone.now().replace(tzinfo=None))
    with pytest.raises(InvalidTask, match="queue name"):
        tasks.add.using(queue_name="Not A Queue")
    with pytest.raises(TypeError):
        tasks.add.enqueue(object(), 1)
    deep: list = []
    for _ in range(200):
        deep = [deep]
    for hostile in ("a\x00b", "lone \ud800", float("nan"), deep):
        with pytest.raises(ValueError) as refused:
            tasks.add.enqueue(hostile, 1)
        assert "input.args[0]" in str(refused.value), refused.value
    assert Run.objects.count() == 0


def test_django_checks_refuse_a_queue_the_engine_cannot_name(settings):
    from django.core.checks import run_checks

    settings.TASKS = {
        "default": {"BACKEND": "runs.tasks.DurableTaskBackend", "QUEUES": ["default", "Bulk Mail"]}
    }
    errors = [e for e in run_checks() if e.id == "runs.E101"]
    assert len(errors) == 1 and "'Bulk Mail'" in errors[0].msg


def test_tasks_of_installed_apps_are_found_without_being_named(processes):
    from examples.crm.tasks import pipeline_report

    result = pipeline_report.enqueue()
    drain(processes, AGENT_MODULES="")  # examples/crm/tasks.py is discovered, like agents.py
    assert pipeline_report.get_result(result.id).return_value == {
        "new": 0,
        "contacted": 0,
        "qualified": 0,
        "proposal": 0,
        "won": 0,
        "lost": 0,
    }


def test_a_task_is_a_run_on_the_dashboard_and_in_the_admin(processes, django_user_model):
    from runs.models import Membership, Tenant

    result = tasks.add.enqueue(20, 22)
    drain(processes)
    tenant = Tenant.objects.get(slug="tasks")
    user = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    Membership.objects.create(user=user, tenant=tenant, role="viewer")
    client = Client()
    client.force_login(user)
    page = client.get(f"/runs/{result.id}/")
    assert page.status_code == 200
    assert b"tests.support.django_tasks.add" in page.content and b"add(20, 22)" in page.content
    listed = client.get("/admin/runs/run/", {"q": str(result.id)})
    assert (
        listed.status_code == 200
        and b"tests.<wbr>support.<wbr>django_<wbr>tasks.<wbr>add" in listed.content
    )
    change = client.get(f"/admin/runs/run/{result.id}/change/")
    assert change.status_code == 200 and b"tests.support.django_tasks.add" in change.content


def test_a_task_run_can_be_retried_like_any_run(processes):
    from runs.control.retry import retry_run
    from runs.events import SYSTEM

    result = tasks.refuse.enqueue("first")
    drain(processes)
    assert tasks.refuse.get_result(result.id).status == TaskResultStatus.FAILED
    retry_run(run=Run.objects.get(pk=result.id), actor=SYSTEM)
    assert tasks.refuse.get_result(result.id).status == TaskResultStatus.READY
    drain(processes)
    again = tasks.refuse.get_result(result.id)
    assert (
        again.status == TaskResultStatus.FAILED and len(again.errors) == 2 and again.attempts == 2
    )


def test_a_second_backend_alias_keeps_its_own_tenant(settings):
    settings.TASKS = settings.TASKS | {
        "other": {
            "BACKEND": "runs.tasks.DurableTaskBackend",
            "OPTIONS": {"TENANT": "other-tasks", "MAX_RUNNING": 7},
        }
    }
    result = tasks.add.using(backend="other").enqueue(5, 5)
    assert result.backend == "other"
    run = Run.objects.select_related("tenant").get(pk=result.id)
    assert (run.tenant.slug, run.tenant.max_running, run.input["backend"]) == (
        "other-tasks",
        7,
        "other",
    )
    assert task_backends["other"].get_result(result.id).backend == "other"
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result.id)


def test_step_attempts_are_the_results_errors(processes, tmp_path):
    result = tasks.flaky.enqueue(str(tmp_path / "m"))
    drain_until_finished(processes, result)
    assert (
        StepAttempt.objects.filter(run_id=result.id).count()
        == len(tasks.flaky.get_result(result.id).errors)
        == 1
    )


def test_a_task_kind_submitted_like_any_run_is_retried_in_its_own_tenant(
    tenant, processes, tmp_path
):
    # Through submit_run (code; a tenant cannot start a task kind) a task kind runs in the caller's tenant:
    # its retry still reads its history, and it finishes.
    run = submit_run(
        tenant=tenant,
        kind="tests.support.django_tasks.flaky",
        input={"args": [str(tmp_path / "m")]},
    )
    for _ in range(10):
        drain(processes)
        run.refresh_from_db()
        if run.status == "done":
            break
    assert (run.status, run.attempt, run.result) == ("done", 2, "sent")
    with pytest.raises(TaskResultDoesNotExist):  # not one of the backend's own tasks
        tasks.flaky.get_result(str(run.pk))
