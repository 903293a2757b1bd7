"""Workflows with real worker processes: durable sleep, timed waits, child runs, sagas and forks."""

from __future__ import annotations

import signal

import pytest
from django.utils import timezone

from runs.control import cancel_run
from runs.events import Actor
from runs.models import Event, Run, Step, Tenant
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import notes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PERSON = Actor(type="user", id="1")


def worker(processes, *args):
    return processes.worker("--poll", "0.2", "--lease", "4", "--heartbeat", "1", *args)


def test_a_sleeping_run_holds_no_slot_and_another_run_of_its_tenant_runs_meanwhile(
    tenant, processes, tmp_path
):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=1)
    log = str(tmp_path / "log")
    sleeper = submit_run(tenant=tenant, kind="wf_sleep", input={"log": log, "seconds": 3})
    worker(processes)
    wait_until(lambda: notes(log, step="before"), what="the sleeper's first step")
    wait_until(
        lambda: fresh(sleeper).status == "queued", what="the sleeper to go back to the queue"
    )
    # Its slot is given back (by the worker's next claim, which returns the slots of runs it let go).
    wait_until(
        lambda: Tenant.objects.get(pk=tenant.pk).running == 0,
        timeout=5,
        what="the slot to be given back",
    )
    other = submit_run(tenant=tenant, kind="occupy", input={"log": log, "seconds": 0.2})
    wait_until(lambda: fresh(other).status == "done", timeout=10, what="the other run to finish")
    wait_until(
        lambda: fresh(sleeper).status == "done",
        timeout=20,
        what="the sleeper to wake and finish",
    )

    (before,), (after,) = notes(log, step="before"), notes(log, step="after")
    (held,) = notes(log, run=str(other.id))
    # The other run of this max_running=1 tenant ran inside the sleep.
    assert before["at"] < held["start"] < held["end"] < after["at"]
    assert after["at"] - before["at"] >= 3
    sleep_step = Step.objects.get(run=sleeper, name="sleep")
    assert (sleep_step.kind, sleep_step.status, sleep_step.executions) == ("sleep", "done", 1)
    assert (
        fresh(sleeper).attempt == 2
    )  # claimed again when the sleep ended, replaying "before" for free


def test_wait_for_message_times_out_and_returns_nothing(tenant, processes):
    quiet = submit_run(tenant=tenant, kind="wf_wait", input={"timeout": 1})
    told = submit_run(tenant=tenant, kind="wf_wait", input={"timeout": 60})
    worker(processes)
    processes.manage("reap", "--interval", "5")
    wait_until(lambda: fresh(told).status == "waiting", what="the run to wait for a message")
    from runs.control import post_message

    post_message(run=fresh(told), actor=PERSON, text="hello")
    wait_until(
        lambda: fresh(quiet).status == "done" and fresh(told).status == "done",
        timeout=20,
        what="both runs to finish",
    )
    assert fresh(quiet).result == {"messages": []}
    assert fresh(told).result == {"messages": ["hello"]}
    assert Event.objects.filter(run=quiet, type="run.queued", payload__reason="timer").count() == 1


def test_a_hundred_children_finishing_at_once_wake_their_parent_exactly_once(
    tenant, processes, tmp_path
):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=200)
    gate = tmp_path / "gate"
    gate.touch()
    parent = submit_run(tenant=tenant, kind="wf_parent", input={"n": 100, "gate": str(gate)})
    for _ in range(2):
        worker(processes, "--concurrency", "60")
    wait_until(
        lambda: fresh(parent).status == "waiting",
        timeout=60,
        what="the parent to wait for its children",
    )
    wait_until(
        lambda: Run.objects.filter(parent=parent, status="running").count() == 100,
        timeout=60,
        what="all hundred children to be running",
    )
    gate.unlink()
    wait_until(lambda: fresh(parent).status == "done", timeout=60, what="the parent to finish")

    parent = fresh(parent)
    assert parent.result["statuses"] == ["done"] * 100
    assert [r["n"] for r in parent.result["results"]] == list(range(100))
    woken = Event.objects.filter(run=parent, type="run.queued", payload__reason="children")
    assert woken.count() == 1
    assert parent.attempt == 2  # claimed once to spawn and park, once when woken
    assert Step.objects.get(run=parent, name="gather").executions == 1
    assert (parent.children_pending, parent.children_needed) == (0, None)
    assert Run.objects.filter(parent=parent).count() == 100


def test_cancelling_a_parent_cancels_its_live_children(tenant, processes, tmp_path):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=2)
    gate = tmp_path / "gate"
    gate.touch()
    parent = submit_run(tenant=tenant, kind="wf_parent", input={"n": 4, "gate": str(gate)})
    worker(processes, "--concurrency", "4")
    wait_until(lambda: fresh(parent).status == "waiting", timeout=30, what="the parent to wait")
    wait_until(
        lambda: Run.objects.filter(parent=parent, status="running").count() == 2,
        timeout=30,
        what="two children to run (the tenant runs two at a time; the waiting parent holds no slot)",
    )
    cancel_run(run=fresh(parent), actor=PERSON)
    wait_until(
        lambda: (
            set(Run.objects.filter(parent=parent).values_list("status", flat=True)) == {"cancelled"}
        ),
        timeout=30,
        what="every child to be cancelled",
    )
    assert fresh(parent).status == "cancelled"
    assert (
        gate.exists()
    )  # the running children stopped on the cancel, not because their gate opened


def test_min_success_wakes_the_parent_early_and_cancels_the_rest(tenant, processes, tmp_path):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=10)
    gate = tmp_path / "gate"
    gate.touch()
    # Children 0 and 1 fail at once; 2 and 3 succeed; 4 and 5 hang at the gate.
    parent = submit_run(
        tenant=tenant, kind="wf_parent", input={"n": 6, "min_success": 2, "fail": [0, 1]}
    )
    worker(processes, "--concurrency", "8")
    wait_until(lambda: fresh(parent).status == "done", timeout=60, what="the parent to finish")
    statuses = fresh(parent).result["statuses"]
    assert statuses.count("done") >= 2
    assert statuses[:2] == ["failed", "failed"]
    assert set(Run.objects.filter(parent=parent).values_list("status", flat=True)) <= {
        "done",
        "failed",
        "cancelled",
    }


def test_a_saga_compensates_in_reverse_order_each_once(tenant, processes, tmp_path):
    log = str(tmp_path / "log")
    run = submit_run(tenant=tenant, kind="wf_saga", input={"log": log, "steps": 4, "fail_at": 4})
    worker(processes)
    wait_until(lambda: fresh(run).status == "failed", timeout=30, what="the saga to fail")
    run = fresh(run)
    assert (run.compensation, run.error_kind) == ("done", "fatal")
    undone = [n["step"] for n in notes(log, action="undo")]
    assert undone == [3, 2, 1]
    assert [n["resource"] for n in notes(log, action="undo")] == ["r3", "r2", "r1"]
    statuses = dict(Step.objects.filter(run=run, kind="custom").values_list("name", "status"))
    assert statuses == {
        "do 1": "compensated",
        "do 2": "compensated",
        "do 3": "compensated",
        "do 4": "failed",
    }
    assert "rolled back: do 3 (step 3), do 2 (step 2), do 1 (step 1)" in run.error
    assert list(
        Step.objects.filter(run=run, kind="compensation")
        .order_by("seq")
        .values_list("name", flat=True)
    ) == ["rollback", "undo do 3", "undo do 2", "undo do 1"]


def test_a_kind_without_compensate_on_keeps_its_work(tenant, processes, tmp_path):
    log = str(tmp_path / "log")
    run = submit_run(tenant=tenant, kind="wf_steps", input={"log": log, "steps": 3, "fail_at": 3})
    worker(processes)
    wait_until(lambda: fresh(run).status == "failed", timeout=30, what="the run to fail")
    assert fresh(run).compensation == ""
    assert list(Step.objects.filter(run=run).order_by("seq").values_list("status", flat=True)) == [
        "done",
        "done",
        "failed",
    ]


def test_sigkill_in_a_compensation_resumes_without_repeating_those_done(
    tenant, processes, tmp_path
):
    log = str(tmp_path / "log")
    gate = tmp_path / "gate"
    gate.touch()
    run = submit_run(
        tenant=tenant,
        kind="wf_saga",
        input={"log": log, "steps": 4, "fail_at": 4, "gate_at": 2, "gate": str(gate)},
    )
    first = worker(processes)
    wait_until(
        lambda: notes(log, action="undo", step=2),
        timeout=30,
        what="the compensation of step 2 to start",
    )
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    gate.unlink()
    assert fresh(run).compensation == "running"
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once")
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr
    second = worker(processes)
    wait_until(lambda: fresh(run).status == "failed", timeout=30, what="the rollback to finish")

    assert fresh(run).compensation == "done"
    undos = notes(log, action="undo")
    assert [n["step"] for n in undos] == [3, 2, 2, 1]
    # The interrupted compensation ran again with the same idempotency key, in the new worker.
    assert undos[1]["key"] == undos[2]["key"] and undos[1]["key"].endswith(":undo")
    assert undos[2]["pid"] == undos[3]["pid"] == second.pid != undos[0]["pid"]
    assert len(notes(log, action="do")) == 4  # no forward step ran again


def test_cancel_with_compensate_rolls_back_a_waiting_saga(tenant, processes, tmp_path):
    log = str(tmp_path / "log")
    gate = tmp_path / "gate"
    gate.touch()
    run = submit_run(
        tenant=tenant,
        kind="wf_saga",
        input={"log": log, "steps": 3, "wait_after": 2, "gate": str(gate)},
    )
    worker(processes)
    wait_until(lambda: len(notes(log, action="do")) == 2, timeout=30, what="two steps to be done")
    outcome = cancel_run(run=fresh(run), actor=PERSON, compensate=True)
    assert outcome.later
    wait_until(
        lambda: fresh(run).status == "cancelled",
        timeout=30,
        what="the run to roll back and cancel",
    )
    assert fresh(run).compensation == "done"
    assert [n["step"] for n in notes(log, action="undo")] == [2, 1]
    assert len(notes(log, action="do")) == 2


def test_a_compensation_that_keeps_failing_waits_for_a_person_who_can_skip_it(
    tenant, processes, tmp_path, api
):
    log = str(tmp_path / "log")
    run = submit_run(
        tenant=tenant,
        kind="wf_saga",
        input={"log": log, "steps": 3, "fail_at": 3, "fatal_undo": [2]},
    )
    worker(processes)
    wait_until(
        lambda: fresh(run).status == "waiting_human",
        timeout=30,
        what="the rollback to stop at step 2",
    )
    run = fresh(run)
    assert run.compensation == "running"
    assert (
        "the compensation of step 2 (do 2) failed, at step 5" in run.error
        and "cannot undo step 2" in run.error
    )
    body = api.get(f"/api/runs/{run.id}").json()
    assert body["waiting_for"]["type"] == "compensation"
    assert body["waiting_for"]["actions"] == ["retry", "done", "skip", "fail"]
    assert body["compensated"] is False

    answer = api.post(
        f"/api/runs/{run.id}/resolve", {"action": "skip"}, content_type="application/json"
    )
    assert answer.status_code == 200, answer.content
    wait_until(
        lambda: fresh(run).status == "failed", timeout=30, what="the rollback to go on and end"
    )
    run = fresh(run)
    assert run.compensation == "partial"
    assert "not undone: do 2 (step 2)" in run.error
    assert [n["step"] for n in notes(log, action="undo")] == [
        2,
        1,
    ]  # step 2's undo ran once, then was skipped
    statuses = dict(Step.objects.filter(run=run, kind="custom").values_list("name", "status"))
    assert statuses == {"do 1": "compensated", "do 2": "done", "do 3": "failed"}
    assert api.get(f"/api/runs/{run.id}").json()["compensation"] == "partial"


def test_retrying_a_rolled_back_run_does_its_steps_again(tenant, processes, tmp_path):
    log = str(tmp_path / "log")
    gate = tmp_path / "gate"
    gate.touch()
    run = submit_run(
        tenant=tenant,
        kind="wf_saga",
        input={"log": log, "steps": 3, "wait_after": 2, "gate": str(gate)},
    )
    worker(processes)
    wait_until(
        lambda: len(notes(log, run=str(run.id), action="do")) == 2,
        timeout=30,
        what="two steps done",
    )
    cancel_run(run=fresh(run), actor=PERSON, compensate=True)
    wait_until(lambda: fresh(run).status == "cancelled", timeout=30, what="the rollback")
    gate.unlink()
    from runs.control import retry_run

    retry_run(run=fresh(run), actor=PERSON)
    wait_until(lambda: fresh(run).status == "done", timeout=30, what="the retried run to finish")
    # Undone steps 1 and 2 run again; step 3 runs for the first time.
    assert [n["step"] for n in notes(log, run=str(run.id), action="do")] == [1, 2, 1, 2, 3]
    assert fresh(run).compensation == ""
    assert fresh(run).generation == 2


def test_a_gather_timeout_cancels_the_stragglers(tenant, processes, tmp_path):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=10)
    gate = tmp_path / "gate"
    gate.touch()
    parent = submit_run(
        tenant=tenant, kind="wf_parent", input={"n": 2, "gate": str(gate), "timeout": 1}
    )
    worker(processes, "--concurrency", "4")
    processes.manage("reap", "--interval", "5")
    wait_until(lambda: fresh(parent).status == "done", timeout=30, what="the gather to time out")
    assert fresh(parent).result["statuses"] == ["cancelled", "cancelled"]
    wait_until(
        lambda: (
            set(Run.objects.filter(parent=parent).values_list("status", flat=True)) == {"cancelled"}
        ),
        timeout=30,
        what="the stragglers to stop",
    )
    assert Event.objects.filter(run=parent, type="run.queued", payload__reason="timer").count() == 1


def test_what_children_spend_counts_toward_their_parents_ceiling(tenant, processes):
    # Each wf_cost_child step costs 30 cents: three children spend 90 of the parent's 100.
    parent = submit_run(
        tenant=tenant, kind="wf_cost_parent", input={"n": 3}, cost_ceiling_cents=100
    )
    Tenant.objects.filter(pk=tenant.pk).update(max_running=10)
    worker(processes, "--concurrency", "4")
    wait_until(lambda: fresh(parent).is_terminal, timeout=30, what="the parent to finish")
    parent = fresh(parent)
    children = list(Run.objects.filter(parent=parent).order_by("created_at"))
    # Each child's ceiling was what its parent had left when it was spawned: all of it
    # for the first, less for a later one when an earlier child had finished and spent 30.
    ceilings = [float(c.cost_ceiling_cents) for c in children]
    assert (
        ceilings[0] == 100.0
        and set(ceilings) <= {100.0, 70.0, 40.0}
        and ceilings == sorted(ceilings, reverse=True)
    )
    assert float(parent.children_cost_cents) == 90.0
    # The parent's own 20-cent step after the gather took it over its ceiling.
    assert (parent.status, parent.error_kind) == ("failed", "budget")


def test_the_built_in_deploy_saga_leaves_nothing_behind_when_a_step_fails(tenant, processes):
    from examples.deploys.models import Resource

    run = submit_run(
        tenant=tenant, kind="deploy_app", input={"app": "shop", "fail_at": "container"}
    )
    processes.worker("--poll", "0.2", RUNS_DEMO_DELAY_SCALE="0.02")
    wait_until(
        lambda: fresh(run).status == "failed",
        timeout=30,
        what="the deploy to fail and roll back",
    )
    run = fresh(run)
    assert (run.compensation, run.error_kind) == ("done", "fatal")
    assert (
        "quota exceeded" in run.error
        and "rolled back: issue certificate (step 2), create DNS record (step 1)" in run.error
    )
    assert sorted(Resource.objects.filter(run_id=run.id).values_list("kind", "state")) == [
        ("certificate", "deleted"),
        ("dns", "deleted"),
    ]
    done = submit_run(tenant=tenant, kind="deploy_app", input={"app": "blog"})
    wait_until(lambda: fresh(done).status == "done", timeout=30, what="a deploy that works")
    assert fresh(done).result["url"] == "https://blog.eu-west.example.test"
    assert Resource.objects.filter(run_id=done.id, state="active").count() == 4


def test_the_built_in_research_many_gathers_with_min_success(tenant, processes):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=10)
    questions = ["What is a lease?", "How are costs bounded?", "What does the reaper do?"]
    parent = submit_run(
        tenant=tenant, kind="research_many", input={"questions": questions, "min_success": 1}
    )
    processes.worker("--poll", "0.2", "--concurrency", "6", RUNS_DEMO_DELAY_SCALE="0.02")
    wait_until(lambda: fresh(parent).is_terminal, timeout=60, what="the lead run to finish")
    parent = fresh(parent)
    assert parent.status == "done", parent.error
    answered = len(parent.result["sections"])
    assert answered >= 1
    assert parent.result["summary"].startswith(f"{answered} of 3 questions answered")
    assert len(parent.result["unanswered"]) == 3 - answered
    assert Run.objects.filter(parent=parent).count() == 3
    bad = api_error(tenant, {"questions": ["ok?"] * 2, "min_success": 3})
    assert "min_success cannot exceed the number of questions" in bad


def api_error(tenant, data) -> str:
    from runs.exceptions import InvalidRunInput

    try:
        submit_run(tenant=tenant, kind="research_many", input=data)
    except InvalidRunInput as exc:
        return str(exc)
    return ""
