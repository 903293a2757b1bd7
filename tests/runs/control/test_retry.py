"""Operator retries through the API: a failed or cancelled run, retry from step N, new bounds.

The runs fail for real under a worker (``Worker`` in burst mode, in this
process); every step appends a line to an execution log, so "replayed, not
re-executed" is counted outside the database.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pytest

from runs.models import Message, Run, Step
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.control_helpers import (
    act,
    assert_events_consistent,
    burst_worker,
    work_until,
)

pytestmark = pytest.mark.django_db(transaction=True)


def calls(log, run) -> Counter:
    return Counter(name for run_id, _, name, _ in executions(log) if run_id == str(run.id))


def retried_by(run, person) -> dict:
    """The payload of the run's last run.retried Event, which must name the person's key."""
    event = run.events.filter(type="run.retried").order_by("-seq").first()
    assert event is not None
    assert (event.actor_type, event.actor_id) == ("api_key", str(person.key.pk))
    return event.payload


def priced(tenant, tmp_path, **input) -> tuple[Run, str]:
    log = str(tmp_path / "exec.log")
    options = {
        k: input.pop(k)
        for k in ("max_attempts", "cost_ceiling_cents", "deadline_seconds")
        if k in input
    }
    return submit_run(
        tenant=tenant, kind="priced_calls", input={"log": log, **input}, **options
    ), log


def test_retry_a_run_that_spent_its_retry_budget_gets_a_fresh_one(tenant, api_person, tmp_path):
    fail = tmp_path / "fail"
    fail.touch()
    run, log = priced(
        tenant, tmp_path, fail_at=2, fail_file=str(fail), error="retryable", max_attempts=2
    )
    run = work_until(run, "failed")
    assert (run.error_kind, run.failures, run.steps_done) == ("retryable", 2, 1)
    fail.unlink()

    response = act(api_person.client, run, "retry")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["status"], body["error"], body["error_kind"], body["finished_at"]) == (
        "queued",
        "",
        "",
        None,
    )
    assert fresh(run).failures == 0
    assert retried_by(run, api_person) == {"from": "failed", "to": "queued", "from_step": None}
    run = work_until(run, "done")
    assert run.result == {"calls": [1, 2, 3, 4]}
    # call1 was recorded before the failures: replayed, never executed again.
    assert calls(log, run) == {"call1": 1, "call2": 3, "call3": 1, "call4": 1}
    assert (run.attempt, run.cost_cents) == (3, Decimal(40))
    assert_events_consistent(run)


def test_retry_a_cancelled_run(tenant, api_person, tmp_path):
    run, log = priced(tenant, tmp_path, steps=2)
    assert act(api_person.client, run, "cancel").status_code == 200

    response = act(api_person.client, run, "retry")

    assert response.status_code == 200
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("queued", False)
    run = work_until(run, "done")
    assert calls(log, run) == {"call1": 1, "call2": 1}
    assert retried_by(run, api_person)["from"] == "cancelled"


def test_retry_from_step_n_re_executes_n_and_later_and_keeps_the_money(
    tenant, api_person, tmp_path
):
    fail = tmp_path / "fail"
    fail.touch()
    run, log = priced(tenant, tmp_path, steps=4, cents=10, fail_at=4, fail_file=str(fail))
    run = work_until(run, "failed")
    assert (run.error_kind, run.cost_cents, run.generation) == ("fatal", Decimal(30), 1)
    fail.unlink()

    response = act(api_person.client, run, "retry", {"from_step": 2})

    assert (response.status_code, response.json()["status"]) == (200, "queued")
    assert response.json()["steps_done"] == 1
    assert retried_by(run, api_person)["from_step"] == 2
    run = work_until(run, "done")
    assert run.generation == 2
    # Step 1 replayed; steps 2 and 3 executed again, step 4 (failed before) once more.
    assert calls(log, run) == {"call1": 1, "call2": 2, "call3": 2, "call4": 2}
    # The money of the discarded steps stays spent: 3 calls, then 3 more.
    assert run.cost_cents == Decimal(60)
    assert sum(Step.objects.filter(run=run).values_list("cost_cents", flat=True)) == Decimal(60)
    # The first generation stays for the audit trail.
    assert list(Step.objects.filter(run=run, generation=1).values_list("seq", "status")) == [
        (1, "done"),
        (2, "done"),
        (3, "done"),
        (4, "failed"),
    ]
    assert list(Step.objects.filter(run=run, generation=2).values_list("seq", "status")) == [
        (1, "done"),
        (2, "done"),
        (3, "done"),
        (4, "done"),
    ]
    assert_events_consistent(run)


def test_retry_from_a_step_the_run_never_reached_is_422(tenant, api_person, tmp_path):
    run, _ = priced(tenant, tmp_path, steps=2)
    act(api_person.client, run, "cancel")

    assert act(api_person.client, run, "retry", {"from_step": 5}).status_code == 422
    assert act(api_person.client, run, "retry", {"from_step": 0}).status_code == 422
    assert fresh(run).status == "cancelled"


def test_retry_from_step_n_hands_back_the_messages_steps_n_and_later_consumed(tenant, api_person):
    run = submit_run(tenant=tenant, kind="chat", input={})
    burst_worker()
    act(api_person.client, run, "messages", {"text": "hello"})
    burst_worker()
    hello = Message.objects.get(run=run)
    assert hello.consumed_by_step.seq == 1
    assert act(api_person.client, run, "cancel").status_code == 200

    assert act(api_person.client, run, "retry", {"from_step": 1}).status_code == 200

    assert Message.objects.get(pk=hello.pk).consumed_by_step is None
    burst_worker()
    run = fresh(run)
    assert run.status == "waiting"
    consumer = Message.objects.get(pk=hello.pk).consumed_by_step
    assert (consumer.generation, consumer.seq) == (2, 1)
    assert Step.objects.get(run=run, generation=2, seq=2).output == "you said hello"


def test_a_run_failed_on_its_budget_needs_a_larger_ceiling(tenant, api_person, tmp_path):
    run, log = priced(tenant, tmp_path, steps=4, cents=10, cost_ceiling_cents=25)
    run = work_until(run, "failed")
    assert (run.error_kind, run.cost_cents) == ("budget", Decimal(30))

    refused = act(api_person.client, run, "retry")
    too_small = act(api_person.client, run, "retry", {"cost_ceiling_cents": 30})

    assert refused.status_code == 409 and "cost_ceiling_cents" in refused.json()["detail"]
    assert too_small.status_code == 409
    assert fresh(run).status == "failed"
    assert act(api_person.client, run, "retry", {"cost_ceiling_cents": 100}).status_code == 200
    run = work_until(run, "done")
    assert (run.cost_cents, run.cost_ceiling_cents) == (Decimal(40), Decimal(100))
    assert calls(log, run) == {"call1": 1, "call2": 1, "call3": 1, "call4": 1}


def test_a_run_failed_on_its_deadline_needs_a_longer_one(tenant, api_person, tmp_path):
    hold = tmp_path / "hold"
    hold.touch()
    run, log = priced(tenant, tmp_path, steps=3, hold_at=2, hold_file=str(hold), deadline_seconds=1)
    run = work_until(run, "failed")
    assert run.error_kind == "deadline"
    hold.unlink()

    refused = act(api_person.client, run, "retry")
    too_short = act(api_person.client, run, "retry", {"deadline_seconds": 1})

    assert refused.status_code == 409 and "deadline_seconds" in refused.json()["detail"]
    assert too_short.status_code == 409
    assert act(api_person.client, run, "retry", {"deadline_seconds": 60}).status_code == 200
    run = work_until(run, "done")
    assert run.deadline_seconds == 60
    assert calls(log, run) == {"call1": 1, "call2": 2, "call3": 1}


@pytest.mark.parametrize("state", ["queued", "done", "waiting"])
def test_only_failed_or_cancelled_runs_can_be_retried(tenant, api_person, state):
    run = submit_run(
        tenant=tenant, kind="chat" if state == "waiting" else "echo", input={"text": "hi"}
    )
    if state != "queued":
        burst_worker()
    before = fresh(run)
    assert before.status == state

    response = act(api_person.client, run, "retry")

    assert response.status_code == 409
    assert fresh(run).last_event_seq == before.last_event_seq
