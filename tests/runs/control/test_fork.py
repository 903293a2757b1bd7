"""Forking a run (POST /api/runs/{id}/fork and the admin): a new run replays the steps before N, runs from N."""

from __future__ import annotations

import json

import pytest

from runs.models import Event, Run, Step, Tenant
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.admin_helpers import add_steps, make_run, messages_of, post_action, staff_user
from tests.support.agents import notes
from tests.support.control_helpers import Person
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until

processes_db = pytest.mark.django_db(transaction=True)
db = pytest.mark.django_db


def fork(client, run, body):
    return client.post(
        f"/api/runs/{run.pk}/fork", data=json.dumps(body), content_type="application/json"
    )


def forked(response) -> Run:
    assert response.status_code == 202, response.content
    return Run.objects.get(pk=response.json()["id"])


def steps_of(run: Run) -> list[tuple[int, str, int]]:
    return list(
        Step.objects.filter(run=run)
        .order_by("generation", "seq")
        .values_list("seq", "status", "executions")
    )


def noted_steps(log: str, run: Run) -> list[int]:
    return [n["step"] for n in notes(log, run=str(run.pk))]


# With real workers


@processes_db
def test_a_fork_replays_the_steps_before_n_and_executes_from_n(tenant, api, processes, tmp_path):
    log = str(tmp_path / "log")
    origin = submit_run(tenant=tenant, kind="wf_steps", input={"log": log, "steps": 4})
    processes.worker("--poll", "0.2")
    wait_until(lambda: fresh(origin).status == "done", timeout=30, what="the origin to finish")

    response = fork(api, origin, {"from_step": 3})
    body = response.json()
    run = forked(response)
    assert response["Location"] == f"/api/runs/{run.pk}"
    assert (body["origin_id"], body["origin_step"], body["status"], body["steps_done"]) == (
        str(origin.pk),
        3,
        "queued",
        2,
    )
    wait_until(lambda: fresh(run).status == "done", timeout=30, what="the fork to finish")

    run = fresh(run)
    assert noted_steps(log, run) == [3, 4]  # steps 1 and 2 replayed from the copies, for free
    assert noted_steps(log, origin) == [1, 2, 3, 4]
    assert run.result == fresh(origin).result == {"steps": [1, 2, 3, 4]}
    assert steps_of(run) == [(1, "done", 0), (2, "done", 0), (3, "done", 1), (4, "done", 1)]
    assert (run.origin_id, run.origin_step, run.tenant_id, run.kind, run.input) == (
        origin.pk,
        3,
        origin.tenant_id,
        origin.kind,
        origin.input,
    )
    assert run.idempotency_key is None and run.callback_url == ""
    first = Event.objects.get(run=run, seq=1)
    assert (first.type, first.payload["forked_from"], first.payload["from_step"]) == (
        "run.queued",
        str(origin.pk),
        3,
    )
    (told,) = Event.objects.filter(run=origin, type="run.forked")
    assert told.payload == {"fork": str(run.pk), "from_step": 3}
    assert (told.actor_type, told.seq) == ("api_key", fresh(origin).last_event_seq)


@processes_db
def test_a_failed_step_before_n_refuses_the_fork_and_a_fork_from_it_runs_it_again(
    tenant, api, processes, tmp_path
):
    log = str(tmp_path / "log")
    origin = submit_run(
        tenant=tenant, kind="wf_steps", input={"log": log, "steps": 4, "fail_at": 2}
    )
    processes.worker("--poll", "0.2")
    wait_until(lambda: fresh(origin).status == "failed", timeout=30, what="the origin to fail")

    refused = fork(api, origin, {"from_step": 3})

    assert refused.status_code == 409
    assert "step 2 is failed" in refused.json()["detail"]
    assert not Run.objects.filter(origin=origin).exists()

    run = forked(fork(api, origin, {"from_step": 2}))
    wait_until(
        lambda: fresh(run).status == "failed",
        timeout=30,
        what="the fork to run step 2 (and fail again)",
    )
    assert noted_steps(log, run) == [2]  # step 1 replayed, step 2 executed again
    assert steps_of(run)[:1] == [(1, "done", 0)]


@processes_db
def test_a_fork_after_the_gather_replays_the_finished_children_and_one_between_is_refused(
    tenant, api, processes, tmp_path
):
    log = str(tmp_path / "log")
    origin = submit_run(tenant=tenant, kind="wf_parent", input={"n": 2, "log": log})
    processes.worker("--poll", "0.2")
    wait_until(
        lambda: fresh(origin).status == "done",
        timeout=30,
        what="the parent and its children to finish",
    )
    # 1, 2: spawn; 3: gather; 4: report.
    children = {str(c) for c in Run.objects.filter(parent=origin).values_list("pk", flat=True)}

    between = fork(api, origin, {"from_step": 3})

    assert between.status_code == 409
    assert "step 3 gathers" in between.json()["detail"]
    run = forked(fork(api, origin, {"from_step": 4}))
    wait_until(lambda: fresh(run).status == "done", timeout=30, what="the fork to finish")
    assert fresh(run).result == fresh(origin).result
    assert len(notes(log, run=str(run.pk), step="report")) == 1
    assert len(notes(log, step="child")) == 2  # no child ran again
    assert {
        str(c) for c in Run.objects.filter(parent__isnull=False).values_list("pk", flat=True)
    } == children


# API refusals


@db
@pytest.mark.parametrize(
    ("from_step", "says"),
    [
        (0, "from_step"),
        ("x", "from_step"),
        (99, "from_step must be between 1 and 4"),
        (True, "from_step"),
    ],
)
def test_a_from_step_outside_the_run_is_a_422(tenant, api, from_step, says):
    run = make_run(tenant, "done")
    add_steps(run, 3)

    response = fork(api, run, {"from_step": from_step})

    assert response.status_code == 422
    assert says in response.json()["detail"]
    assert not Run.objects.filter(origin=run).exists()


@db
def test_a_missing_body_is_a_422(tenant, api):
    run = make_run(tenant, "done")

    response = api.post(f"/api/runs/{run.pk}/fork", content_type="application/json")

    assert response.status_code == 422
    assert "detail" in response.json()


@db
def test_another_tenants_run_is_not_found_and_a_read_only_key_is_forbidden(tenant, api):
    theirs = make_run(TenantFactory(), "done")
    reader = Person(tenant, "reader", scopes=["runs:read"])
    mine = make_run(tenant, "done")

    assert fork(api, theirs, {"from_step": 1}).status_code == 404
    assert fork(reader.client, theirs, {"from_step": 1}).status_code == 404
    assert fork(reader.client, mine, {"from_step": 1}).status_code == 403
    assert not Run.objects.filter(origin__isnull=False).exists()


@db
def test_a_compensated_step_before_n_is_a_409(tenant, api):
    run = make_run(tenant, "failed")
    steps = add_steps(run, 3)
    Step.objects.filter(pk=steps[1].pk).update(status="compensated")

    response = fork(api, run, {"from_step": 4})

    assert response.status_code == 409
    assert response.json()["detail"].startswith("step 2 is compensated")
    assert forked(fork(api, run, {"from_step": 2})).steps_done == 1


@db
def test_a_spawn_before_n_whose_child_is_live_is_a_409_until_the_child_finishes(tenant, api):
    run = make_run(tenant, "waiting")
    child = make_run(tenant, "running", parent=run)
    add_steps(run, 1)
    Step.objects.create(
        run=run,
        seq=2,
        name="spawn noop3",
        kind="child",
        status="done",
        input={"kind": "noop3"},
        output={"run_id": str(child.pk), "kind": "noop3", "key": "1:2"},
    )

    response = fork(api, run, {"from_step": 3})

    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"step 2 spawned child run {child.pk} which has not finished; fork after it finishes"
    )
    assert fork(api, run, {"from_step": 2}).status_code == 202  # the spawn runs again in the fork

    Run.objects.filter(pk=child.pk).update(
        status="done", lease_token=None, locked_by=None, locked_until=None
    )
    copy = forked(fork(api, run, {"from_step": 3}))
    assert Step.objects.get(run=copy, seq=2).output["run_id"] == str(child.pk)
    assert copy.parent_id is None  # a fork is nobody's child


@db
def test_a_fork_between_a_spawn_and_the_gather_awaiting_its_child_is_a_409(tenant, api):
    run = make_run(tenant, "waiting")
    child = make_run(tenant, "done", parent=run)
    Step.objects.create(
        run=run,
        seq=1,
        name="spawn noop3",
        kind="child",
        status="done",
        output={"run_id": str(child.pk), "kind": "noop3", "key": "c"},
    )
    Step.objects.create(
        run=run,
        seq=2,
        name="gather",
        kind="child",
        status="waiting",
        input={"children": [str(child.pk)]},
        output={"pending": [str(child.pk)]},
    )

    response = fork(api, run, {"from_step": 2})

    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"step 1 spawned child run {child.pk}, which step 2 gathers, and a fork cannot gather its origin's "
        "children: fork from step 1 or earlier, or after step 2"
    )
    assert fork(api, run, {"from_step": 1}).status_code == 202


@db
def test_a_fork_copies_the_run_settings_but_not_its_money_webhook_or_key(tenant, api):
    run = submit_run(
        tenant=tenant,
        kind="noop3",
        input={"note": "x"},
        priority=2,
        max_attempts=7,
        deadline_seconds=120,
        cost_ceiling_cents=50,
        idempotency_key="once",
    )
    Run.objects.filter(pk=run.pk).update(
        status="done", kind_version=3, cost_cents=12, callback_url="https://example.com/hook"
    )
    add_steps(run, 2)  # cost 1 and 2 cents, tokens

    copy = forked(fork(api, run, {"from_step": 3}))

    assert (
        copy.kind_version,
        copy.priority,
        copy.queue,
        copy.max_attempts,
        copy.deadline_seconds,
    ) == (3, 2, run.queue, 7, 120)
    assert (copy.cost_ceiling_cents, copy.cost_cents, copy.generation, copy.attempt) == (
        50,
        0,
        1,
        0,
    )
    assert (copy.idempotency_key, copy.callback_url, copy.steps_done) == (None, "", 2)
    copies = Step.objects.filter(run=copy).order_by("seq")
    assert [(s.name, s.output, s.tokens_in, s.cost_cents, s.executions) for s in copies] == [
        ("step 1", {"seq": 1}, 0, 0, 0),
        ("step 2", {"seq": 2}, 0, 0, 0),
    ]


@db
def test_a_fork_from_the_latest_generation_of_a_retried_run(tenant, api):
    run = make_run(tenant, "failed")
    add_steps(run, 3)  # generation 1
    Run.objects.filter(pk=run.pk).update(generation=2)
    Step.objects.create(
        run=run, generation=2, seq=1, name="again", kind="tool", status="done", output={"g": 2}
    )

    assert fork(api, run, {"from_step": 4}).status_code == 422  # generation 2 has one step
    copy = forked(fork(api, run, {"from_step": 2}))
    assert list(Step.objects.filter(run=copy).values_list("generation", "name", "output")) == [
        (1, "again", {"g": 2})
    ]


@db
def test_a_full_queue_is_a_429(tenant, api):
    run = make_run(tenant, "done")
    Tenant.objects.filter(pk=tenant.pk).update(queued=5, max_queued=5)

    response = fork(api, run, {"from_step": 1})

    assert response.status_code == 429
    assert response["Retry-After"] == "5"
    assert not Run.objects.filter(origin=run).exists()
    assert not Event.objects.filter(run=run, type="run.forked").exists()


# The admin


@pytest.fixture
def retrying_staff_client(client, db):
    """The admin test client logged in as a staff member who may view runs and retry them, nothing more."""
    client.force_login(staff_user("view_run", "view_step", "retry_run"))
    return client


@db
def test_the_admin_forks_a_run_from_the_step_chosen_and_links_the_new_run(
    retrying_staff_client, tenant
):
    run = make_run(tenant, "done")
    add_steps(run, 3)

    form = post_action(retrying_staff_client, "fork_from_step", [run])

    assert form.status_code == 200
    assert b'name="from_step"' in form.content and b"step 3" in form.content
    assert not Run.objects.filter(origin=run).exists()  # nothing happens before the form is sent

    response = post_action(retrying_staff_client, "fork_from_step", [run], apply="1", from_step="3")

    assert response.status_code == 302
    (copy,) = Run.objects.filter(origin=run)
    assert (copy.origin_step, copy.status, copy.steps_done) == (3, "queued", 2)
    (message,) = messages_of(response)
    assert f'<a href="/admin/runs/run/{copy.pk}/change/">{copy.pk}</a>' in message
    told = Event.objects.get(run=run, type="run.forked")
    assert (told.actor_type, told.payload["fork"]) == ("user", str(copy.pk))
    page = retrying_staff_client.get(f"/admin/runs/run/{copy.pk}/change/").content.decode()
    assert f"/admin/runs/run/{run.pk}/change/" in page  # the fork's page links its origin


@db
def test_the_admin_shows_a_refusal_as_an_error_message(retrying_staff_client, tenant):
    run = make_run(tenant, "failed")
    add_steps(run, 2)
    Step.objects.filter(run=run, seq=2).update(status="failed")

    too_far = post_action(retrying_staff_client, "fork_from_step", [run], apply="1", from_step="9")
    refused = post_action(retrying_staff_client, "fork_from_step", [run], apply="1", from_step="3")

    assert too_far.status_code == refused.status_code == 200  # the form again, never a 500
    assert "from_step must be between 1 and 3" in messages_of(too_far)[0]
    assert "step 2 is failed" in messages_of(refused)[0]
    assert "step 2 is failed" in refused.content.decode()  # on the page shown
    assert not Run.objects.filter(origin=run).exists()


@db
def test_the_admin_fork_needs_the_retry_permission(client, tenant):
    client.force_login(staff_user("view_run", "cancel_run"))
    run = make_run(tenant, "done")

    assert b'value="fork_from_step"' not in client.get("/admin/runs/run/").content
    response = post_action(client, "fork_from_step", [run], apply="1", from_step="1")

    assert messages_of(response) == ["No action selected."]
    assert not Run.objects.filter(origin=run).exists()
