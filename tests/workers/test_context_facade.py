"""RunContext is a facade over parts that keep their state to themselves, and a run given back by its
worker says why: a cancel, a pause or a shutdown, each under its own name in the run's events.

The first tests read the code (the linter's SLF001 finds an object reaching into another's private
attributes); the others run a real worker process and look at the Events a client's stream, a
webhook's receiver and the dashboard read.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runs.models import Event, Run, Step, Worker
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.control_helpers import Person, act, steps_of
from tests.support.waiting import wait_until
from workers.context import RunContext
from workers.errors import (
    LeaseLost,
    NonDeterministic,
    ReleaseReason,
    ReleaseRun,
    RunSignal,
    StopRun,
    Suspend,
)

ROOT = Path(__file__).resolve().parents[2]

# The OpenAI Agents adapter's runner still calls private methods of its own model and tool
# wrappers; making them public is a change of its own.
NOT_YET = {"workers/frameworks/openai_agents.py"}


def private_reach_ins(folder: str) -> list[str]:
    found = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "SLF001", "--output-format", "json"]
        + [folder],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode in (0, 1), found.stderr
    return [
        f"{Path(v['filename']).relative_to(ROOT)}:{v['location']['row']}: {v['message']}"
        for v in json.loads(found.stdout)
        if str(Path(v["filename"]).relative_to(ROOT)) not in NOT_YET
    ]


def test_no_part_of_the_execution_layer_reads_another_s_private_attributes():
    assert private_reach_ins("workers") == []


def test_run_context_is_composed_of_parts_not_mixins():
    assert RunContext.__bases__ == (object,)
    # Its state is its parts, each made in its __init__: nothing is declared for a base to set.
    assert not getattr(RunContext, "__annotations__", {})


def test_a_signal_that_fails_the_run_is_no_suspension():
    """Suspend says "leaves the worker without failing": the signals that fail the run are not one."""
    assert issubclass(StopRun, RunSignal) and not issubclass(StopRun, Suspend)
    assert not issubclass(NonDeterministic, Suspend)
    assert issubclass(ReleaseRun, Suspend) and issubclass(LeaseLost, Suspend)
    assert {ReleaseRun(reason).reason.value for reason in ReleaseReason} == {
        "shutdown",
        "cancel_requested",
        "pause_requested",
    }


# --- why a worker gave a run back ------------------------------------------------------

live = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ops(tenant):
    return Person(tenant, "ops")


def started(processes, *args):
    proc = processes.worker("--concurrency", "1", "--poll", "0.2", *args)
    wait_until(
        lambda: Worker.objects.filter(pid=proc.pid, stopped_at__isnull=True).exists(),
        timeout=30,
        what="the worker to register",
    )
    return proc


def stopped(processes, proc) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, processes.output(proc)


def in_first_step(run: Run, log: str) -> None:
    wait_until(
        lambda: steps_of(log, run).get("step1", 0) > 0 and fresh(run).current_step == "step1",
        what="step1 to run",
    )


def requeued_by_worker(run: Run) -> Event:
    """The Event of the worker's exit back to the queue: the run.queued after its last claim."""
    claimed = Event.objects.filter(run=run, type="run.running").order_by("-seq").first()
    return Event.objects.get(run=run, type="run.queued", seq__gt=claimed.seq)


@live
def test_a_run_cancelled_while_running_is_recorded_as_cancelled_not_as_a_shutdown(
    tenant, ops, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    worker = started(processes, "--heartbeat", "30")
    run = submit_run(
        tenant=tenant, kind="long_steps", input={"steps": 3, "log": log, "hold_file": str(hold)}
    )
    in_first_step(run, log)

    assert act(ops.client, run, "cancel").status_code == 202

    wait_until(lambda: fresh(run).status == "cancelled", timeout=15, what="the cancel")
    event = Event.objects.get(run=run, type="run.cancelled")
    assert (event.actor_type, event.payload["reason"]) == ("worker", "cancel_requested")
    assert Step.objects.filter(run=run).count() == 1  # released before its next step
    stopped(processes, worker)


@live
def test_a_run_paused_while_running_is_recorded_as_paused_for_the_pause(
    tenant, ops, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    worker = started(processes, "--heartbeat", "30")
    run = submit_run(
        tenant=tenant, kind="long_steps", input={"steps": 3, "log": log, "hold_file": str(hold)}
    )
    in_first_step(run, log)

    assert act(ops.client, run, "pause").status_code == 202
    hold.unlink()

    wait_until(lambda: fresh(run).status == "paused", timeout=15, what="the pause")
    event = Event.objects.get(run=run, type="run.paused")
    assert (event.actor_type, event.payload["reason"]) == ("worker", "pause_requested")
    stopped(processes, worker)


@live
def test_a_run_released_by_a_stopping_worker_is_queued_for_the_shutdown(
    tenant, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    worker = started(processes, "--heartbeat", "1")
    run = submit_run(
        tenant=tenant, kind="long_steps", input={"steps": 3, "log": log, "hold_file": str(hold)}
    )
    in_first_step(run, log)

    worker.send_signal(signal.SIGTERM)  # the step in flight finishes, then the run is given back
    hold.unlink()

    assert worker.wait(30) == 0, processes.output(worker)
    run = fresh(run)
    assert (run.status, run.steps_done, run.failures) == ("queued", 1, 0)
    event = requeued_by_worker(run)
    assert (event.type, event.actor_type, event.payload["reason"]) == (
        "run.queued",
        "worker",
        "shutdown",
    )
