"""People acting on runs through the API: cancel, pause, resume, approve, reject, resolve, messages.

Runs get into the state under test through a real worker (``Worker`` in
burst mode, in this process); what needs separate worker processes (long
steps, SIGKILL, an idle worker) is in test_control.py, operator retries in
test_control_retry.py, scopes and tenants in test_control_scopes.py.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections

from runs.models import Message, Run, Step, Tenant
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.control_helpers import (
    RowLock,
    act,
    ambiguous_run,
    approval_run,
    assert_events_consistent,
    backends_waiting_on_locks,
    burst_worker,
    chat_run,
    event_types,
    get,
    steps_of,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


# --- cancel ---------------------------------------------------------------------


@pytest.mark.parametrize("state", ["queued", "paused", "waiting", "waiting_human"])
def test_cancel_of_a_run_that_is_not_running_is_immediate(tenant, api_person, tmp_path, state):
    log = str(tmp_path / "exec.log")
    if state in ("queued", "paused"):
        run = submit_run(tenant=tenant, kind="steps", input={"steps": 2, "log": log})
        if state == "paused":
            assert act(api_person.client, run, "pause").status_code == 200
    else:
        run = chat_run(tenant) if state == "waiting" else approval_run(tenant, log)
    assert fresh(run).status == state
    executed = len(executions(log))

    response = act(api_person.client, run, "cancel")

    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("cancelled", True)
    run = fresh(run)
    assert (run.status, run.lease_token) == ("cancelled", None)
    assert run.finished_at is not None
    assert api_person.did(run, "run.cancelled").payload == {"from": state, "to": "cancelled"}
    burst_worker()  # nothing of it runs any more
    assert fresh(run).status == "cancelled"
    assert len(executions(log)) == executed
    tenant = Tenant.objects.get(pk=tenant.pk)
    assert (tenant.running, tenant.queued) == (0, 0)
    assert_events_consistent(run)


@pytest.mark.parametrize(
    "kind,status", [("echo", "done"), ("broken", "failed"), ("echo", "cancelled")]
)
def test_cancel_of_a_finished_run_is_409_and_changes_nothing(tenant, api_person, kind, status):
    run = submit_run(tenant=tenant, kind=kind, input={"text": "hi"} if kind == "echo" else {})
    if status == "cancelled":
        act(api_person.client, run, "cancel")
    else:
        burst_worker()
    before = fresh(run)
    assert before.status == status

    response = act(api_person.client, run, "cancel")

    assert response.status_code == 409
    assert status in response.json()["detail"]
    after = fresh(run)
    assert (after.status, after.last_event_seq) == (status, before.last_event_seq)
    assert after.finished_at == before.finished_at


# --- pause and resume -------------------------------------------------------------


def test_pause_a_queued_run_then_resume_it(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    run = submit_run(tenant=tenant, kind="steps", input={"steps": 2, "log": log})

    paused = act(api_person.client, run, "pause")

    assert paused.status_code == 200
    assert (paused.json()["status"], paused.json()["waiting_for"]) == ("paused", {"type": "resume"})
    burst_worker()
    assert fresh(run).status == "paused"
    assert executions(log) == []  # a paused run is not claimed

    resumed = act(api_person.client, run, "resume")

    assert (resumed.status_code, resumed.json()["status"]) == (200, "queued")
    burst_worker()
    assert fresh(run).status == "done"
    api_person.did(run, "run.paused")
    api_person.did(run, "run.resumed")
    assert_events_consistent(run)


def test_pause_and_resume_refuse_states_that_do_not_allow_them(tenant, api_person, tmp_path):
    waiting = approval_run(tenant, str(tmp_path / "exec.log"))
    done = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})
    burst_worker()
    queued = submit_run(tenant=tenant, kind="echo", input={"text": "again"})

    assert act(api_person.client, waiting, "pause").status_code == 409
    assert act(api_person.client, done, "pause").status_code == 409
    assert act(api_person.client, queued, "resume").status_code == 409
    assert act(api_person.client, waiting, "resume").status_code == 409
    assert fresh(waiting).status == "waiting_human"
    assert fresh(queued).status == "queued"


# --- approvals --------------------------------------------------------------------


def test_approve_with_a_comment_resumes_the_run_with_the_decision(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    run = approval_run(tenant, log)
    assert get(api_person.client, run)["waiting_for"] == {
        "type": "approval",
        "step": 2,
        "name": "update_crm",
        "proposal": {"fields": {"stage": "won"}},
    }

    response = act(api_person.client, run, "approve", {"comment": "ship it", "step": 2})

    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["waiting_for"]) == ("queued", None)
    assert api_person.did(run, "run.approved").payload["comment"] == "ship it"
    burst_worker()
    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"applied": True, "comment": "ship it", "by": api_person.actor}
    approval = Step.objects.get(run=run, seq=2)
    assert (approval.kind, approval.status, approval.executions) == ("approval", "done", 1)
    assert approval.output["approved"] is True and approval.output["by"] == api_person.actor
    assert steps_of(log, run) == {"draft": 1, "update_crm": 1}
    assert event_types(run).count("run.waiting_human") == 1  # asked once, never again
    assert_events_consistent(run)


def test_reject_tells_the_agent_and_it_does_not_act(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    run = approval_run(tenant, log)

    response = act(api_person.client, run, "reject", {"comment": "not this quarter"})

    assert (response.status_code, response.json()["status"]) == (200, "queued")
    burst_worker()
    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"applied": False, "comment": "not this quarter", "by": api_person.actor}
    assert Step.objects.get(run=run, seq=2).output["approved"] is False
    assert steps_of(log, run) == {"draft": 1}
    api_person.did(run, "run.rejected")


def test_approve_needs_no_body(tenant, api_person, tmp_path):
    run = approval_run(tenant, str(tmp_path / "exec.log"))

    assert act(api_person.client, run, "approve").status_code == 200
    burst_worker()
    assert fresh(run).result == {"applied": True, "comment": "", "by": api_person.actor}


def test_a_second_approval_is_409(tenant, api_person, tmp_path):
    run = approval_run(tenant, str(tmp_path / "exec.log"))
    assert act(api_person.client, run, "approve", {"comment": "first"}).status_code == 200

    again = act(api_person.client, run, "approve", {"comment": "second"})
    rejected = act(api_person.client, run, "reject", {"comment": "third"})

    assert again.status_code == 409 and "no pending approval" in again.json()["detail"]
    assert rejected.status_code == 409
    assert Step.objects.get(run=run, seq=2).output["comment"] == "first"
    assert event_types(run).count("run.approved") == 1 and "run.rejected" not in event_types(run)


def test_approve_naming_another_step_is_409(tenant, api_person, tmp_path):
    run = approval_run(tenant, str(tmp_path / "exec.log"))

    wrong = act(api_person.client, run, "approve", {"step": 1})

    assert wrong.status_code == 409
    assert "step 2" in wrong.json()["detail"]
    assert fresh(run).status == "waiting_human"
    assert Step.objects.get(run=run, seq=2).status == "waiting"
    assert act(api_person.client, run, "reject", {"step": 3}).status_code == 409
    assert act(api_person.client, run, "approve", {"step": 2}).status_code == 200


def _race(*calls):
    """Start the calls on threads at the same moment; return their answers in order."""
    barrier = threading.Barrier(len(calls))
    answers: list = [None] * len(calls)

    def run(i, call):
        try:
            barrier.wait(10)
            answers[i] = call()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def test_approve_racing_reject_exactly_one_wins(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    runs = [
        submit_run(tenant=tenant, kind="approve_then_act", input={"log": log}) for _ in range(6)
    ]
    burst_worker()
    assert {fresh(run).status for run in runs} == {"waiting_human"}

    for run in runs:
        approve, reject = _race(
            lambda run=run: act(api_person.client, run, "approve", {"comment": "yes"}),
            lambda run=run: act(api_person.client, run, "reject", {"comment": "no"}),
        )
        assert sorted([approve.status_code, reject.status_code]) == [200, 409]
        decided = Step.objects.get(run=run, seq=2).output
        assert decided["approved"] is (approve.status_code == 200)
        assert len({"run.approved", "run.rejected"} & set(event_types(run))) == 1
    burst_worker()
    for run in runs:
        run = fresh(run)
        assert run.status == "done"
        assert run.result["applied"] is Step.objects.get(run=run, seq=2).output["approved"]
        assert_events_consistent(run)


def test_approve_racing_cancel_never_leaves_a_half_decided_run(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    runs = [
        submit_run(tenant=tenant, kind="approve_then_act", input={"log": log}) for _ in range(6)
    ]
    burst_worker()
    assert {fresh(run).status for run in runs} == {"waiting_human"}

    for run in runs:
        approve, cancel = _race(
            lambda run=run: act(api_person.client, run, "approve", {"comment": "yes"}),
            lambda run=run: act(api_person.client, run, "cancel"),
        )
        # Cancel always wins the run (a run approved a moment earlier is merely queued);
        # the approval either landed first or found nothing pending.
        assert cancel.status_code == 200, cancel.content
        assert approve.status_code in (200, 409), approve.content
        step = Step.objects.get(run=run, seq=2)
        assert step.status == ("done" if approve.status_code == 200 else "waiting")
        assert fresh(run).status == "cancelled"
        assert_events_consistent(run)
    burst_worker()
    assert steps_of(log, runs[0]) == {"draft": 1}
    assert all(fresh(run).status == "cancelled" for run in runs)


@pytest.mark.parametrize("first", ["approve", "cancel"])
def test_approve_and_cancel_arriving_together_are_serialised(tenant, api_person, tmp_path, first):
    """Both wait on the run row; the one queued first acts first, the other sees its result."""
    log = str(tmp_path / "exec.log")
    run = approval_run(tenant, log)
    order = [first, "cancel" if first == "approve" else "approve"]
    answers: dict = {}

    def call(action):
        try:
            answers[action] = act(
                api_person.client, run, action, {"comment": "go"} if action == "approve" else None
            )
        finally:
            connections.close_all()

    threads = []
    with RowLock(Run.objects.filter(pk=run.pk)):
        for n, action in enumerate(order, start=1):
            threads.append(threading.Thread(target=call, args=(action,)))
            threads[-1].start()
            wait_until(
                lambda n=n: len(backends_waiting_on_locks()) == n,
                timeout=10,
                what=f"{action} to wait",
            )
    for thread in threads:
        thread.join(30)

    run = fresh(run)
    assert run.status == "cancelled"
    if first == "cancel":
        # The approval came too late: nothing was approved.
        assert (answers["cancel"].status_code, answers["approve"].status_code) == (200, 409)
        assert Step.objects.get(run=run, seq=2).status == "waiting"
        assert "run.approved" not in event_types(run)
    else:
        # Approved, queued, then cancelled before any worker took it: both acted, in order.
        assert (answers["approve"].status_code, answers["cancel"].status_code) == (200, 200)
        assert Step.objects.get(run=run, seq=2).output["approved"] is True
        assert event_types(run)[-2:] == ["run.approved", "run.cancelled"]
    burst_worker()
    assert fresh(run).status == "cancelled"
    assert steps_of(log, run) == {"draft": 1}  # update_crm never ran
    assert_events_consistent(run)


# --- resolving an ambiguous side effect ----------------------------------------------


def test_an_ambiguous_step_shows_in_waiting_for(tenant, api_person, tmp_path):
    run = ambiguous_run(tenant, str(tmp_path / "exec.log"))

    waiting_for = get(api_person.client, run)["waiting_for"]

    assert waiting_for["type"] == "ambiguous"
    assert (waiting_for["step"], waiting_for["name"]) == (2, "charge")
    assert waiting_for["actions"] == ["done", "retry", "fail"]
    assert "closed the connection" in waiting_for["error"]
    assert fresh(run).error_kind == "ambiguous"


def test_resolve_done_records_the_output_and_does_not_execute_the_step_again(
    tenant, api_person, tmp_path
):
    log = str(tmp_path / "exec.log")
    run = ambiguous_run(tenant, log)

    response = act(
        api_person.client, run, "resolve", {"action": "done", "output": {"receipt": "r-1"}}
    )

    assert (response.status_code, response.json()["status"]) == (200, "queued")
    assert api_person.did(run, "run.resolved").payload["action"] == "done"
    charge = Step.objects.get(run=run, seq=2)
    assert (charge.status, charge.output) == ("done", {"receipt": "r-1"})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.result, run.error_kind) == ("done", {"charged": {"receipt": "r-1"}}, "")
    assert steps_of(log, run) == {"prepare": 1, "charge": 1, "finish": 1}
    assert Step.objects.get(run=run, seq=2).executions == 1
    assert_events_consistent(run)


def test_resolve_retry_executes_the_step_once_more(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    run = ambiguous_run(tenant, log)

    assert act(api_person.client, run, "resolve", {"action": "retry"}).status_code == 200
    burst_worker()

    run = fresh(run)
    assert (run.status, run.failures) == ("done", 0)
    assert run.result == {"charged": {"receipt": "from-the-retry", "amount": 42}}
    assert steps_of(log, run) == {"prepare": 1, "charge": 2, "finish": 1}
    assert Step.objects.get(run=run, seq=2).executions == 2
    api_person.did(run, "run.resolved")


def test_resolve_fail_fails_the_run_as_ambiguous(tenant, api_person, tmp_path):
    log = str(tmp_path / "exec.log")
    run = ambiguous_run(tenant, log)

    response = act(api_person.client, run, "resolve", {"action": "fail"})

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["error_kind"]) == ("failed", "ambiguous")
    burst_worker()
    run = fresh(run)
    assert (run.status, run.error_kind) == ("failed", "ambiguous")
    assert run.finished_at is not None
    assert steps_of(log, run) == {"prepare": 1, "charge": 1}
    # A terminal transition keeps its event type (webhooks listen for run.failed).
    assert api_person.did(run, "run.failed").payload["action"] == "fail"
    assert_events_consistent(run)


def test_resolve_without_a_pending_ambiguous_step_is_409(tenant, api_person, tmp_path):
    approval = approval_run(tenant, str(tmp_path / "exec.log"))
    queued = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})

    for run in (approval, queued):
        response = act(api_person.client, run, "resolve", {"action": "done", "output": 1})
        assert response.status_code == 409, response.content
    # ... and an ambiguous step is not an approval.
    ambiguous = ambiguous_run(tenant, str(tmp_path / "b.log"))
    assert act(api_person.client, ambiguous, "approve", {}).status_code == 409
    assert fresh(ambiguous).status == "waiting_human"
    assert fresh(approval).status == "waiting_human"
    assert Step.objects.get(run=approval, seq=2).status == "waiting"
    assert act(api_person.client, queued, "resolve", {"action": "undo"}).status_code == 422


# --- messages ---------------------------------------------------------------------


def test_a_message_wakes_a_waiting_run_which_consumes_it(tenant, api_person):
    run = chat_run(tenant)
    assert get(api_person.client, run)["waiting_for"] == {"type": "message"}

    response = act(api_person.client, run, "messages", {"text": "hello"})

    assert (response.status_code, response.json()["status"]) == (200, "queued")
    burst_worker()
    assert fresh(run).status == "waiting"  # answered, and waits for the next one
    hello = Message.objects.get(run=run)
    step = hello.consumed_by_step
    assert (step.seq, step.kind, step.status) == (1, "message", "done")
    assert step.output[0]["text"] == "hello" and step.output[0]["author"] == api_person.actor
    assert Step.objects.get(run=run, seq=2).output == "you said hello"

    act(api_person.client, run, "messages", {"text": "bye"})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.result) == ("done", {"seen": ["hello", "bye"]})
    assert Message.objects.filter(run=run, consumed_by_step__isnull=True).count() == 0
    assert_events_consistent(run)


def test_a_message_to_a_finished_run_is_409(tenant, api_person):
    run = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})
    burst_worker()

    response = act(api_person.client, run, "messages", {"text": "too late"})

    assert response.status_code == 409
    assert not Message.objects.filter(run=run).exists()
    assert act(api_person.client, chat_run(tenant), "messages", {"text": "  "}).status_code == 422
