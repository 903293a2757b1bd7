"""GET endpoints of the JSON API: a run, the run list, the steps trail, kinds, health, docs.

Submitting (POST /api/runs) is covered in test_api_submit.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from runs.control import retry_run
from runs.events import Actor
from runs.keys import create_api_key
from runs.models import ApiKey, Queue, Run
from runs.services import submit_run
from tests.support.factories import TenantFactory
from workers.worker import Worker, WorkerOptions


def client_for(secret: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {secret}"})


def assert_error(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"].strip()
    return body


def echo(tenant, text: str = "hi", **kwargs) -> Run:
    return submit_run(tenant=tenant, kind="echo", input={"text": text}, **kwargs)


def run_worker_until_idle() -> None:
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()


@pytest.fixture
def other_tenant(db):
    return TenantFactory()


# --- GET /api/runs/{id} ---------------------------------------------------------


def test_get_run_shows_a_queued_run(api, tenant):
    run = echo(tenant, cost_ceiling_cents=250)

    response = api.get(f"/api/runs/{run.id}")

    assert response.status_code == 200
    body = response.json()
    assert body["id"] == str(run.id)
    assert body["kind"] == "echo"
    assert body["status"] == "queued"
    assert body["current_step"] == ""
    assert body["steps_done"] == 0
    assert body["steps_total"] is None
    assert body["attempt"] == 0
    assert body["max_attempts"] == 3
    assert body["cost_cents"] == 0
    assert body["cost_ceiling_cents"] == 250
    assert body["result"] is None
    assert body["error"] == ""
    assert body["error_kind"] == ""
    assert body["cancel_requested"] is False
    assert body["pause_requested"] is False
    # DjangoJSONEncoder writes ISO 8601 with milliseconds (as ECMAScript does).
    assert abs(datetime.fromisoformat(body["created_at"]) - run.created_at) < timedelta(
        milliseconds=1
    )
    assert body["started_at"] is None
    assert body["finished_at"] is None


def test_get_run_money_is_a_json_number(api, tenant):
    run = echo(tenant)
    Run.objects.filter(id=run.id).update(cost_cents=Decimal("12.345600"))

    body = api.get(f"/api/runs/{run.id}").json()

    assert isinstance(body["cost_cents"], float)
    assert body["cost_cents"] == 12.3456


def test_get_run_shows_progress_and_failure(api, tenant):
    run = echo(tenant)
    Run.objects.filter(id=run.id).update(
        status="failed",
        current_step="lookup",
        steps_done=2,
        steps_total=5,
        attempt=3,
        error="the CRM rejected the record",
        error_kind="fatal",
        finished_at=timezone.now(),
    )

    body = api.get(f"/api/runs/{run.id}").json()

    assert (body["status"], body["current_step"]) == ("failed", "lookup")
    assert (body["steps_done"], body["steps_total"], body["attempt"]) == (2, 5, 3)
    assert (body["error"], body["error_kind"]) == ("the CRM rejected the record", "fatal")
    assert body["finished_at"] is not None


def test_get_run_costs_two_queries(api, tenant, django_assert_num_queries):
    run = echo(tenant)
    api.get("/api/health")  # warm-up without auth: must not note the key's use
    assert ApiKey.objects.get().last_used_at is None
    api.get("/api/kinds")  # notes the key's use, so the measured request need not
    assert ApiKey.objects.get().last_used_at is not None

    # 1: the key with its tenant (select_related); 2: the run, scoped to the
    # tenant. No UPDATE of last_used_at (written at most once a minute), no
    # second query for the scope check or the tenant.
    with django_assert_num_queries(2):
        response = api.get(f"/api/runs/{run.id}")

    assert response.status_code == 200


def test_unknown_run_is_404(api):
    body = assert_error(api.get("/api/runs/00000000-0000-0000-0000-000000000000"), 404)
    assert "not found" in body["detail"]


def test_malformed_run_id_is_a_json_4xx(api):
    response = api.get("/api/runs/not-a-uuid")

    assert 400 <= response.status_code < 500
    assert_error(response, response.status_code)


# --- auth and tenant isolation ----------------------------------------------------


def test_get_run_without_a_key_is_401_even_if_the_run_exists(tenant):
    run = echo(tenant)

    assert_error(Client().get(f"/api/runs/{run.id}"), 401)


def test_get_run_with_a_revoked_key_is_401(api, tenant):
    run = echo(tenant)
    ApiKey.objects.update(revoked_at=timezone.now())

    assert_error(api.get(f"/api/runs/{run.id}"), 401)
    assert_error(api.get("/api/runs"), 401)


def test_another_tenants_run_is_404_on_every_read(api, other_tenant):
    theirs = echo(other_tenant, text="secret")

    assert_error(api.get(f"/api/runs/{theirs.id}"), 404)
    assert_error(api.get(f"/api/runs/{theirs.id}/steps"), 404)


def test_run_list_shows_only_the_callers_runs(api, tenant, other_tenant):
    mine = {str(echo(tenant).id), str(echo(tenant).id)}
    echo(other_tenant)

    body = api.get("/api/runs").json()

    assert {item["id"] for item in body["items"]} == mine


class TestReadScope:
    """A key without runs:read: 404 for what it cannot see, then 403 (that precedence)."""

    @pytest.fixture
    def write_only(self, tenant):
        return client_for(
            create_api_key(tenant=tenant, name="wo", scopes=[ApiKey.Scope.WRITE]).secret
        )

    def test_own_run_is_403(self, write_only, tenant):
        run = echo(tenant)

        assert "runs:read" in assert_error(write_only.get(f"/api/runs/{run.id}"), 403)["detail"]
        assert_error(write_only.get(f"/api/runs/{run.id}/steps"), 403)

    def test_another_tenants_run_is_404_not_403(self, write_only, other_tenant):
        theirs = echo(other_tenant)

        assert_error(write_only.get(f"/api/runs/{theirs.id}"), 404)
        assert_error(write_only.get(f"/api/runs/{theirs.id}/steps"), 404)

    def test_list_and_kinds_are_403(self, write_only):
        assert_error(write_only.get("/api/runs"), 403)
        assert_error(write_only.get("/api/kinds"), 403)


# --- GET /api/runs: keyset pagination and filters ---------------------------------


def all_pages(api, query: str = "", limit: int = 3) -> tuple[list[str], int]:
    """Follow next_cursor to the end; the ids in order and the number of pages."""
    ids: list[str] = []
    url = f"/api/runs?limit={limit}{query}"
    pages = 0
    while True:
        response = api.get(url)
        assert response.status_code == 200, response.content
        body = response.json()
        pages += 1
        assert len(body["items"]) <= limit
        ids += [item["id"] for item in body["items"]]
        if body["next_cursor"] is None:
            return ids, pages
        assert pages < 50, "next_cursor never became null"
        url = f"/api/runs?limit={limit}{query}&cursor={body['next_cursor']}"


def test_pages_cover_every_run_once_newest_first(api, tenant):
    created = [str(echo(tenant, text=f"run {n}").id) for n in range(7)]

    ids, pages = all_pages(api, limit=3)

    assert ids == list(reversed(created))
    assert pages == 3


def test_an_exactly_full_last_page_has_no_next_cursor(api, tenant):
    for n in range(6):
        echo(tenant, text=f"run {n}")

    ids, pages = all_pages(api, limit=3)

    assert len(ids) == 6
    assert pages == 2


def test_pages_are_stable_when_runs_share_a_timestamp(api, tenant):
    """The cursor is (created_at, id): runs created in the same microsecond are neither lost nor repeated."""
    for n in range(7):
        echo(tenant, text=f"run {n}")
    Run.objects.update(created_at=timezone.now())

    ids, _ = all_pages(api, limit=2)

    assert ids == sorted(
        {str(run_id) for run_id in Run.objects.values_list("id", flat=True)}, reverse=True
    )


def test_runs_created_after_the_first_page_do_not_shift_later_pages(api, tenant):
    older = [str(echo(tenant, text=f"old {n}").id) for n in range(4)]
    first = api.get("/api/runs?limit=2").json()
    echo(tenant, text="newer")  # would push an offset-based page 2 by one

    second = api.get(f"/api/runs?limit=2&cursor={first['next_cursor']}").json()

    assert [item["id"] for item in first["items"] + second["items"]] == list(reversed(older))


@pytest.fixture
def mixed_runs(tenant):
    """Two echo runs on 'default' (one done), one noop3 on 'bulk'."""
    done = echo(tenant, text="done")
    Run.objects.filter(id=done.id).update(status="done", finished_at=timezone.now())
    queued = echo(tenant, text="queued")
    Queue.objects.create(name="bulk")  # an operator-made queue
    bulk = submit_run(tenant=tenant, kind="noop3", input={}, queue="bulk")
    return {"done": str(done.id), "queued": str(queued.id), "bulk": str(bulk.id)}


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("&status=done", ["done"]),
        ("&status=queued", ["bulk", "queued"]),
        ("&kind=echo", ["queued", "done"]),
        ("&kind=noop3", ["bulk"]),
        ("&queue=bulk", ["bulk"]),
        ("&queue=default&status=queued", ["queued"]),
        ("&status=running", []),
    ],
)
def test_list_filters(api, mixed_runs, query, expected):
    ids, _ = all_pages(api, query, limit=1)

    assert ids == [mixed_runs[name] for name in expected]


def test_list_items_carry_the_run_fields(api, tenant):
    run = echo(tenant)

    (item,) = api.get("/api/runs").json()["items"]

    assert (item["id"], item["kind"], item["status"], item["queue"]) == (
        str(run.id),
        "echo",
        "queued",
        "default",
    )


@pytest.mark.parametrize("cursor", ["garbage", "bm90LWpzb24", "WyJub3QtYS1kYXRlIiwgIngiXQ"])
def test_invalid_cursor_is_422(api, tenant, cursor):
    echo(tenant)

    body = assert_error(api.get(f"/api/runs?cursor={cursor}"), 422)
    assert "cursor" in body["detail"]


@pytest.mark.parametrize("limit", [0, -1, 201, 500, "many"])
def test_limit_out_of_range_is_422(api, limit):
    body = assert_error(api.get(f"/api/runs?limit={limit}"), 422)
    assert "limit" in body["detail"]
    assert body["errors"]


def test_unknown_status_filter_is_422(api):
    assert "status" in assert_error(api.get("/api/runs?status=finished"), 422)["detail"]


# --- after a worker ran it: steps trail and final state ------------------------------


@pytest.mark.django_db(transaction=True)
def test_steps_trail_of_an_executed_run(api):
    response = api.post(
        "/api/runs", data={"kind": "steps", "input": {"steps": 3}}, content_type="application/json"
    )
    run_id = response.json()["id"]

    run_worker_until_idle()

    run = api.get(f"/api/runs/{run_id}").json()
    assert run["status"] == "done"
    assert run["result"] == {"steps": 3, "last": {"seq": 3, "name": "step3"}}
    assert (run["steps_done"], run["steps_total"], run["attempt"]) == (3, 3, 1)
    assert run["started_at"] is not None and run["finished_at"] is not None

    steps = api.get(f"/api/runs/{run_id}/steps")
    assert steps.status_code == 200
    trail = steps.json()["items"]
    assert steps.json()["next_cursor"] is None
    assert [(s["seq"], s["name"], s["status"]) for s in trail] == [
        (1, "step1", "done"),
        (2, "step2", "done"),
        (3, "step3", "done"),
    ]
    assert [s["output"] for s in trail] == [{"seq": n, "name": f"step{n}"} for n in (1, 2, 3)]
    assert all(s["executions"] == 1 and s["error"] == "" for s in trail)
    assert all(s["started_at"] is not None and s["ended_at"] is not None for s in trail)


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_reports_its_error(api, tenant):
    run = submit_run(tenant=tenant, kind="broken", input={})

    run_worker_until_idle()

    body = api.get(f"/api/runs/{run.id}").json()
    assert body["status"] == "failed"
    assert body["error_kind"] == "fatal"
    assert "field 'email' is invalid" in body["error"]
    (step,) = api.get(f"/api/runs/{run.id}/steps").json()["items"]
    assert (step["name"], step["status"]) == ("validate", "failed")
    assert "field 'email' is invalid" in step["error"]


def test_steps_of_a_queued_run_is_an_empty_list(api, tenant):
    run = echo(tenant)

    response = api.get(f"/api/runs/{run.id}/steps")

    assert response.status_code == 200
    assert response.json() == {"items": [], "next_cursor": None}


@pytest.mark.django_db(transaction=True)
def test_the_audit_trail_comes_in_keyset_pages_across_generations(api, tenant):
    run = submit_run(tenant=tenant, kind="steps", input={"steps": 5})
    run_worker_until_idle()
    # As if its last steps had failed: retried from step 4, generation 2 copies steps 1-3.
    Run.objects.filter(pk=run.pk).update(status="failed", error_kind="fatal")
    retry_run(run=run, actor=Actor(type="user", id="1"), from_step=4)
    run_worker_until_idle()

    seen, cursor, pages = [], None, 0
    while True:
        query = {"limit": 3} | ({"cursor": cursor} if cursor else {})
        body = api.get(f"/api/runs/{run.id}/steps", query).json()
        pages += 1
        assert len(body["items"]) <= 3
        seen += [(s["generation"], s["seq"]) for s in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [(1, n) for n in range(1, 6)] + [(2, n) for n in range(1, 6)]
    assert pages == 4
    assert_error(api.get(f"/api/runs/{run.id}/steps", {"cursor": "not-a-cursor"}), 422)
    assert_error(api.get(f"/api/runs/{run.id}/steps", {"limit": 501}), 422)


# --- kinds, health, docs -----------------------------------------------------------


def test_kinds_lists_echo_with_its_input_schema(api):
    response = api.get("/api/kinds")

    assert response.status_code == 200
    kinds = {kind["name"]: kind for kind in response.json()}
    assert {"echo", "steps", "noop3"} <= set(kinds)
    echo_kind = kinds["echo"]
    assert echo_kind["queue"] == "default"
    assert echo_kind["description"] == "Repeat the text."
    schema = echo_kind["input_schema"]
    assert set(schema["properties"]) == {"text", "times"}
    assert schema["required"] == ["text"]
    assert schema["properties"]["times"]["maximum"] == 10
    assert kinds["noop3"]["input_schema"] == {"type": "object"}


def test_kinds_need_a_key(db):
    assert_error(Client().get("/api/kinds"), 401)


def test_health_answers_without_a_key(db):
    response = Client().get("/api/health")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_docs_and_openapi_schema_are_served(db):
    docs = Client().get("/api/docs")
    assert docs.status_code == 200
    assert docs["Content-Type"].startswith("text/html")

    schema = Client().get("/api/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/runs" in paths
    assert "/api/runs/{run_id}" in paths
    assert {"post", "get"} <= set(paths["/api/runs"])
