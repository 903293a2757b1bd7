"""Admin actions on runs through the admin test client: state reached, Event naming the operator, refusals."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs.admin import run_actions
from runs.models import Run, Step
from tests.conftest import fresh
from tests.support.admin_helpers import (
    ACTION_PERMISSIONS,
    CHANGELIST,
    add_steps,
    last_event,
    make_run,
    messages_of,
    post_action,
    staff_user,
    waiting_on,
)
from tests.support.factories import UserFactory

pytestmark = pytest.mark.django_db


def assert_recorded(run: Run, event_type: str, user) -> dict:
    event = last_event(run)
    assert (event.type, event.actor_type, event.actor_id) == (event_type, "user", str(user.pk))
    return event.payload


# Cancel


def test_cancel_asks_first_then_stops_a_queued_run_at_once(operator_client, operator, tenant):
    run = make_run(tenant, "queued")

    confirmation = post_action(operator_client, "cancel_runs", [run])

    assert confirmation.status_code == 200
    assert (
        b"Cancel these runs?" in confirmation.content
        and str(run.pk)[:8].encode() in confirmation.content
    )
    assert fresh(run).status == "queued"

    response = post_action(operator_client, "cancel_runs", [run], apply="1")

    assert response.status_code == 302
    assert fresh(run).status == "cancelled"
    assert assert_recorded(run, "run.cancelled", operator)["from"] == "queued"
    assert messages_of(response) == ["Cancelled 1 run."]


def test_cancel_of_a_running_run_is_a_request_its_worker_honours(operator_client, operator, tenant):
    run = make_run(tenant, "running")

    response = post_action(operator_client, "cancel_runs", [run], apply="1")

    run = fresh(run)
    assert run.status == "running"
    assert run.cancel_requested_at is not None
    assert_recorded(run, "run.cancel_requested", operator)
    assert "1 running: they stop at their next step boundary" in messages_of(response)[0]


def test_cancel_skips_finished_runs_and_says_why(operator_client, operator, tenant):
    done = make_run(tenant, "done")
    queued = make_run(tenant, "queued")

    response = post_action(operator_client, "cancel_runs", [done, queued], apply="1")

    assert fresh(done).status == "done"
    assert fresh(queued).status == "cancelled"
    assert messages_of(response) == [
        "Cancelled 1 run.",
        "Skipped 1 run: cannot cancel a run that is done.",
    ]


# Retry


def test_retry_queues_a_failed_run_with_a_fresh_attempt_budget(operator_client, operator, tenant):
    run = make_run(tenant, "failed", error_kind="retryable", error="timeout", failures=3)

    post_action(operator_client, "retry_runs", [run])

    run = fresh(run)
    assert (run.status, run.failures, run.error_kind, run.finished_at) == ("queued", 0, "", None)
    assert assert_recorded(run, "run.retried", operator)["from_step"] is None


def test_retry_from_step_asks_for_the_step_then_discards_the_later_ones(
    operator_client, operator, tenant
):
    run = make_run(tenant, "failed", error_kind="fatal", error="the CRM said no")
    add_steps(run, 3)

    form = post_action(operator_client, "retry_from_step", [run])

    assert form.status_code == 200
    assert b'name="from_step"' in form.content
    assert b"step 3" in form.content  # the steps to choose from
    assert fresh(run).status == "failed"  # nothing happens before the form is sent

    response = post_action(operator_client, "retry_from_step", [run], apply="1", from_step="2")

    assert response.status_code == 302
    run = fresh(run)
    assert (run.status, run.generation) == ("queued", 2)
    assert list(Step.objects.filter(run=run, generation=2).values_list("seq", flat=True)) == [1]
    assert assert_recorded(run, "run.retried", operator)["from_step"] == 2


def test_retry_from_step_shows_the_services_refusal_on_the_form(operator_client, tenant):
    run = make_run(tenant, "failed", error_kind="fatal")
    add_steps(run, 2)

    response = post_action(operator_client, "retry_from_step", [run], apply="1", from_step="9")

    assert response.status_code == 200
    assert b"from_step must be between 1 and 3" in response.content
    assert fresh(run).status == "failed"


def test_retry_from_step_needs_exactly_one_run(operator_client, tenant):
    runs = [make_run(tenant, "failed"), make_run(tenant, "failed")]

    response = post_action(operator_client, "retry_from_step", runs)

    assert response.status_code == 302
    assert messages_of(response) == ["Select exactly one run for this action."]
    assert {fresh(r).status for r in runs} == {"failed"}


# Requeue a stuck run


def test_requeue_returns_a_run_whose_lease_expired(operator_client, operator, tenant):
    stuck = make_run(tenant, "running", locked_until=timezone.now() - timedelta(minutes=1))
    healthy = make_run(tenant, "running")

    response = post_action(operator_client, "requeue_stuck_runs", [stuck, healthy])

    stuck, healthy = fresh(stuck), fresh(healthy)
    assert (stuck.status, stuck.lease_token, stuck.failures) == ("queued", None, 1)
    assert assert_recorded(stuck, "run.queued", operator)["reason"] == "requeued"
    assert healthy.status == "running"
    assert messages_of(response)[1] == (
        "Skipped 1 run: only a running run whose lease has expired can be requeued."
    )


# Approve, reject, resolve


@pytest.mark.parametrize(
    ("action", "event", "approved"),
    [
        ("approve_runs", "run.approved", True),
        ("reject_runs", "run.rejected", False),
    ],
)
def test_approval_decisions_queue_the_run_with_the_decision(
    operator_client, operator, tenant, action, event, approved
):
    run, step = waiting_on(tenant, kind="approval")

    post_action(operator_client, action, [run], apply="1")

    assert fresh(run).status == "queued"
    step.refresh_from_db()
    assert (step.status, step.output["approved"], step.output["by"]) == (
        "done",
        approved,
        f"user:{operator.pk}",
    )
    assert assert_recorded(run, event, operator)["step"] == 1


def test_approve_skips_a_run_without_a_pending_approval(operator_client, tenant):
    run, _ = waiting_on(tenant, kind="tool")  # ambiguous, not an approval

    response = post_action(operator_client, "approve_runs", [run], apply="1")

    assert fresh(run).status == "waiting_human"
    assert "has no pending approval" in messages_of(response)[0]


def test_resolve_shows_the_ambiguous_step_then_marks_it_done_with_the_output(
    operator_client, operator, tenant
):
    run, step = waiting_on(tenant, kind="tool")

    form = post_action(operator_client, "resolve_runs", [run])

    assert form.status_code == 200
    assert b"the connection dropped after sending" in form.content
    assert b'name="output"' in form.content

    post_action(
        operator_client,
        "resolve_runs",
        [run],
        apply="1",
        resolution="done",
        output='{"invoice": 7}',
    )

    run = fresh(run)
    step.refresh_from_db()
    assert run.status == "queued"
    assert (step.status, step.output) == ("done", {"invoice": 7})
    assert assert_recorded(run, "run.resolved", operator)["action"] == "done"


def test_resolve_can_fail_the_run(operator_client, operator, tenant):
    run, step = waiting_on(tenant, kind="tool")

    post_action(operator_client, "resolve_runs", [run], apply="1", resolution="fail")

    run = fresh(run)
    assert (run.status, run.error_kind) == ("failed", "ambiguous")
    # A terminal event keeps its type (webhooks listen for run.failed); the payload says how.
    assert assert_recorded(run, "run.failed", operator)["action"] == "fail"


def test_resolve_refuses_output_that_is_not_json(operator_client, tenant):
    run, _ = waiting_on(tenant, kind="tool")

    response = post_action(
        operator_client, "resolve_runs", [run], apply="1", resolution="done", output="{not json"
    )

    assert response.status_code == 200
    assert b"Enter a valid JSON" in response.content
    assert fresh(run).status == "waiting_human"


# Bulk actions over a filtered selection


def test_bulk_cancel_covers_the_whole_filtered_selection_in_batches(
    operator_client, operator, tenant, monkeypatch
):
    monkeypatch.setattr(run_actions, "BATCH_SIZE", 3)
    chosen = [make_run(tenant, "queued", kind="noop3") for _ in range(7)]
    other_kind = make_run(tenant, "queued", kind="broken")

    # "Select all" on the changelist filtered by kind: only one row's checkbox is sent.
    response = post_action(
        operator_client,
        "cancel_runs",
        chosen[:1],
        url=f"{CHANGELIST}?kind=noop3",
        select_across="1",
        apply="1",
    )

    assert response.status_code == 302
    assert {fresh(run).status for run in chosen} == {"cancelled"}
    assert fresh(other_kind).status == "queued"
    for run in chosen:
        assert_recorded(run, "run.cancelled", operator)
    assert messages_of(response) == ["Cancelled 7 runs."]


def test_bulk_retry_covers_the_filtered_selection(operator_client, operator, tenant):
    failed = [make_run(tenant, "failed", error_kind="retryable") for _ in range(4)]
    cancelled = make_run(tenant, "cancelled")

    post_action(
        operator_client,
        "retry_runs",
        failed[:1],
        url=f"{CHANGELIST}?status__exact=failed",
        select_across="1",
        apply="1",
    )

    assert {fresh(run).status for run in failed} == {"queued"}
    assert fresh(cancelled).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_bulk_action_commits_batch_by_batch(tenant, operator):
    """Each batch is one transaction of its own: a selection of a million runs never holds one open."""
    runs = [make_run(tenant, "queued") for _ in range(7)]
    transactions = []

    def cancel(run):
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current()")
            transactions.append(cursor.fetchone()[0])

    tally = run_actions.apply_in_batches(
        Run.objects.filter(pk__in=[r.pk for r in runs]), cancel, batch_size=3
    )

    assert tally.done == 7
    batches = [transactions.count(txid) for txid in dict.fromkeys(transactions)]
    assert batches == [3, 3, 1]


# Permissions


def test_anonymous_and_non_staff_users_are_sent_to_the_admin_login(client, db):
    assert client.get(CHANGELIST)["Location"].startswith("/admin/login/")
    client.force_login(UserFactory(is_staff=False))
    response = client.get(CHANGELIST)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_staff_without_view_permission_cannot_open_runs(client, db):
    client.force_login(staff_user())

    assert client.get(CHANGELIST).status_code == 403
    assert client.get("/admin/runs/run/overview/").status_code == 403


ACTIONS = {
    "cancel_runs": "cancel_run",
    "retry_runs": "retry_run",
    "retry_from_step": "retry_run",
    "requeue_stuck_runs": "requeue_run",
    "approve_runs": "approve_run",
    "reject_runs": "approve_run",
    "resolve_runs": "resolve_run",
}


@pytest.mark.parametrize(("action", "permission"), ACTIONS.items())
def test_each_action_needs_its_own_permission(client, tenant, action, permission):
    others = [p for p in ACTION_PERMISSIONS if p != permission]
    client.force_login(staff_user("view_run", *others))
    run = make_run(tenant, "queued")

    page = client.get(CHANGELIST)
    response = post_action(client, action, [run])

    assert f'value="{action}"'.encode() not in page.content
    assert response.status_code == 302
    assert messages_of(response) == ["No action selected."]
    assert (fresh(run).status, fresh(run).last_event_seq) == ("queued", run.last_event_seq)

    client.force_login(staff_user("view_run", permission))
    assert f'value="{action}"'.encode() in client.get(CHANGELIST).content
