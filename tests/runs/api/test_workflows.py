"""The workflow parts of the API without workers: cancel with compensate, the tree of runs, resolve skip."""

from __future__ import annotations

import pytest

from runs.models import Event, Run, Step
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.run_states import force_status

pytestmark = pytest.mark.django_db


def post(api, path, body=None):
    return api.post(path, body if body is not None else {}, content_type="application/json")


def test_cancel_with_compensate_of_a_run_with_nothing_done_cancels_at_once(api, tenant):
    run = submit_run(tenant=tenant, kind="wf_saga", input={"log": "", "steps": 2})
    answer = post(api, f"/api/runs/{run.id}/cancel", {"compensate": True})
    assert answer.status_code == 200, answer.content
    assert answer.json()["status"] == "cancelled"
    assert fresh(run).compensation == ""


def test_cancel_with_compensate_of_a_waiting_saga_queues_it_for_its_rollback(api, tenant):
    run = force_status(
        submit_run(tenant=tenant, kind="wf_saga", input={"log": "", "steps": 2}),
        "waiting_human",
        attempt=1,
    )
    Step.objects.create(run=run, seq=1, name="do 1", status="done", output={"resource": "r1"})
    answer = post(api, f"/api/runs/{run.id}/cancel", {"compensate": True})
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert (body["status"], body["compensation"], body["cancel_requested"]) == (
        "queued",
        "requested",
        True,
    )
    assert Event.objects.filter(
        run=run, type="run.cancel_requested", payload__compensate=True
    ).exists()
    # Asked again, it is the same request: still queued for the rollback, nothing doubled.
    assert post(api, f"/api/runs/{run.id}/cancel", {"compensate": True}).status_code == 202
    assert fresh(run).compensation == "requested"


@pytest.mark.parametrize("body", [{"compensate": "yes"}, {"compensate": 1}, {"compensate": None}])
def test_cancel_refuses_a_compensate_that_is_not_a_boolean(api, tenant, body):
    run = submit_run(tenant=tenant, kind="wf_saga", input={"log": "", "steps": 2})
    answer = post(api, f"/api/runs/{run.id}/cancel", body)
    assert answer.status_code == 422
    assert "compensate" in answer.json()["detail"]
    assert fresh(run).status == "queued"


def test_the_run_json_names_its_parent_and_the_list_gives_a_runs_children(api, tenant):
    parent = submit_run(tenant=tenant, kind="wf_parent", input={"n": 2})
    children = [submit_run(tenant=tenant, kind="wf_child", input={"n": i}) for i in range(2)]
    Run.objects.filter(pk__in=[c.pk for c in children]).update(parent=parent)
    submit_run(tenant=tenant, kind="wf_child", input={"n": 9})  # not a child

    listed = api.get(f"/api/runs?parent={parent.id}").json()["items"]
    assert sorted(r["id"] for r in listed) == sorted(str(c.id) for c in children)
    child = api.get(f"/api/runs/{children[0].id}").json()
    assert child["parent_id"] == str(parent.id)
    body = api.get(f"/api/runs/{parent.id}").json()
    assert (body["parent_id"], body["children_pending"], body["children_cost_cents"]) == (
        None,
        0,
        0,
    )
    assert (body["origin_id"], body["origin_step"], body["compensation"], body["compensated"]) == (
        None,
        None,
        "",
        False,
    )
    assert api.get("/api/runs?parent=not-a-uuid").status_code == 422


def test_skip_is_only_for_a_compensation(api, tenant):
    run = force_status(
        submit_run(tenant=tenant, kind="wf_steps", input={"log": "", "steps": 1}),
        "waiting_human",
        attempt=1,
        error_kind="ambiguous",
    )
    Step.objects.create(run=run, seq=1, name="step 1", status="waiting")
    answer = post(api, f"/api/runs/{run.id}/resolve", {"action": "skip"})
    assert answer.status_code == 409
    assert "only a compensation can be skipped" in answer.json()["detail"]
    assert fresh(run).status == "waiting_human"


@pytest.mark.django_db(transaction=True)
def test_a_deadlock_met_by_a_transition_is_a_503_and_the_retry_succeeds(api, tenant):
    import threading

    import psycopg
    from django.db import connections

    from tests.conftest import test_database_url
    from tests.support.control_helpers import backends_waiting_on_locks
    from tests.support.waiting import wait_until

    parent = submit_run(tenant=tenant, kind="wf_parent", input={"n": 1})
    child = submit_run(tenant=tenant, kind="wf_child", input={"n": 0})
    Run.objects.filter(pk=child.pk).update(parent=parent)
    # Another session holds the parent's row, as a worker's heartbeat of it would...
    other = psycopg.connect(test_database_url())
    other.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [parent.pk])
    answers = {}

    def cancel_child():
        try:
            answers["first"] = post(api, f"/api/runs/{child.id}/cancel")
        finally:
            connections.close_all()

    request = threading.Thread(target=cancel_child)
    request.start()
    pid = other.info.backend_pid
    # ... the cancel locks the child and waits for the parent (to wake it) ...
    wait_until(
        lambda: any(pid in blockers for _, _, blockers in backends_waiting_on_locks()),
        timeout=10,
        what="the cancel to wait for the parent's row",
    )
    # ... and the other session now wants the child: PostgreSQL breaks the cycle.
    other.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [child.pk])
    request.join(15)
    other.rollback()
    other.close()
    first = answers["first"]
    assert first.status_code == 503, first.content
    assert first["Retry-After"] == "1" and "retry" in first.json()["detail"]
    assert fresh(child).status == "queued"  # nothing was written
    again = post(api, f"/api/runs/{child.id}/cancel")
    assert again.status_code == 200 and fresh(child).status == "cancelled"
