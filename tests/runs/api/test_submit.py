"""POST /api/runs and the in-process submit_run: creation, idempotency, validation, auth.

Reads (GET endpoints, pagination, tenant isolation, the steps trail) are in
test_api_read.py.
"""

from __future__ import annotations

import json
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

import runs
from runs.exceptions import QueueFull
from runs.keys import create_api_key
from runs.models import ApiKey, Event, Queue, Run
from tests.support.factories import TenantFactory
from workers.worker import Worker, WorkerOptions

ECHO = {"kind": "echo", "input": {"text": "hello", "times": 2}}


def post_run(client: Client, body: dict | str, **headers):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post("/api/runs", data=data, content_type="application/json", headers=headers)


def client_for(secret: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {secret}"})


def assert_error(response, status: int) -> dict:
    """The answer is JSON ``{"detail": "<readable sentence>", ...}`` with this status."""
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"].strip()
    return body


# --- creation -----------------------------------------------------------------


def test_submit_answers_202_with_location_and_writes_run_and_queued_event(api, tenant):
    response = post_run(api, ECHO)

    assert response.status_code == 202
    body = response.json()
    assert body["status"] == "queued"
    assert response["Location"] == f"/api/runs/{body['id']}"
    run = Run.objects.get()
    assert str(run.id) == body["id"]
    assert run.tenant == tenant
    assert run.kind == "echo"
    assert run.input == {"text": "hello", "times": 2}
    assert list(Event.objects.filter(run=run).values_list("seq", "type")) == [(1, "run.queued")]


def test_submit_stores_the_normalised_input_and_kind_defaults(api):
    body = post_run(api, {"kind": "echo", "input": {"text": "hi"}}).json()

    run = Run.objects.get(id=body["id"])
    assert run.input == {"text": "hi", "times": 1}  # the schema's default filled in
    assert (body["queue"], body["priority"]) == ("default", 5)


def test_submit_honours_queue_priority_and_max_attempts(api):
    Queue.objects.create(name="bulk.low")
    response = post_run(api, {**ECHO, "queue": "bulk.low", "priority": 0, "max_attempts": 7})

    assert response.status_code == 202
    run = Run.objects.get(id=response.json()["id"])
    assert (run.queue, run.priority, run.max_attempts) == ("bulk.low", 0, 7)


def test_an_unknown_queue_is_422_and_names_the_known_ones(api):
    body = assert_error(post_run(api, {**ECHO, "queue": "nobody-serves-this"}), 422)
    assert "unknown queue 'nobody-serves-this'" in body["detail"]
    assert "default" in body["detail"]
    assert Run.objects.count() == 0


# --- idempotency --------------------------------------------------------------


def test_same_body_idempotency_key_and_same_request_returns_the_same_run(api):
    first = post_run(api, {**ECHO, "idempotency_key": "order-1"})
    second = post_run(api, {**ECHO, "idempotency_key": "order-1"})

    assert first.status_code == 202
    assert second.status_code == 200
    assert second.json()["id"] == first.json()["id"]
    assert second["Location"] == first["Location"]
    assert Run.objects.count() == 1
    assert Event.objects.count() == 1


def test_same_header_idempotency_key_and_same_request_returns_the_same_run(api):
    first = post_run(api, ECHO, **{"Idempotency-Key": "order-2"})
    second = post_run(api, ECHO, **{"Idempotency-Key": "order-2"})

    assert first.status_code == 202
    assert second.status_code == 200
    assert second.json()["id"] == first.json()["id"]
    assert Run.objects.get().idempotency_key == "order-2"


def test_header_and_body_idempotency_keys_are_the_same_key(api):
    first = post_run(api, {**ECHO, "idempotency_key": "order-3"})
    second = post_run(api, ECHO, **{"Idempotency-Key": "order-3"})

    assert second.status_code == 200
    assert second.json()["id"] == first.json()["id"]


def test_idempotency_compares_the_normalised_request(api):
    """``times`` omitted and ``times: 1`` (its default) are the same request."""
    first = post_run(api, {"kind": "echo", "input": {"text": "x"}, "idempotency_key": "k"})
    second = post_run(
        api, {"kind": "echo", "input": {"times": 1, "text": "x"}, "idempotency_key": "k"}
    )

    assert second.status_code == 200
    assert second.json()["id"] == first.json()["id"]


def test_same_idempotency_key_with_other_input_is_409(api):
    first = post_run(api, {**ECHO, "idempotency_key": "order-4"})
    other = post_run(api, {"kind": "echo", "input": {"text": "bye"}, "idempotency_key": "order-4"})

    body = assert_error(other, 409)
    assert "order-4" in body["detail"]
    assert "different request" in body["detail"]
    assert Run.objects.count() == 1
    assert str(Run.objects.get().id) == first.json()["id"]


def test_same_idempotency_key_with_other_priority_is_409(api):
    post_run(api, {**ECHO, "idempotency_key": "order-5"})

    assert_error(post_run(api, {**ECHO, "idempotency_key": "order-5", "priority": 1}), 409)
    assert Run.objects.count() == 1


def test_header_and_body_idempotency_keys_that_differ_are_422(api):
    response = post_run(api, {**ECHO, "idempotency_key": "a"}, **{"Idempotency-Key": "b"})

    body = assert_error(response, 422)
    assert "Idempotency-Key" in body["detail"]
    assert Run.objects.count() == 0


def test_idempotency_keys_are_per_tenant(api):
    other_tenant_key = create_api_key(tenant=TenantFactory(), name="b").secret
    mine = post_run(api, {**ECHO, "idempotency_key": "shared"})
    theirs = post_run(
        client_for(other_tenant_key),
        {"kind": "echo", "input": {"text": "other"}, "idempotency_key": "shared"},
    )

    assert mine.status_code == 202
    assert theirs.status_code == 202
    assert theirs.json()["id"] != mine.json()["id"]


def test_a_rejected_submit_does_not_spend_its_idempotency_key(api):
    assert_error(post_run(api, {"kind": "echo", "input": {}, "idempotency_key": "retry-me"}), 422)
    assert Run.objects.count() == 0

    # The client fixes its input and retries with the same key: a new run.
    assert post_run(api, {**ECHO, "idempotency_key": "retry-me"}).status_code == 202


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_submits_with_the_same_key_make_one_run(api_key):
    """Both requests pass the "key unused?" check before either inserts; the unique index decides."""
    barrier = threading.Barrier(2)
    answers: list = [None, None]

    def submit(slot: int) -> None:
        try:
            client = client_for(api_key)
            barrier.wait(timeout=10)
            answers[slot] = post_run(client, {**ECHO, "idempotency_key": "race"})
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(answer.status_code for answer in answers) == [200, 202]
    assert answers[0].json()["id"] == answers[1].json()["id"]
    assert Run.objects.filter(idempotency_key="race").count() == 1
    assert Event.objects.count() == 1


# --- backpressure ------------------------------------------------------------------

# Backpressure: a tenant with max_queued runs waiting gets 429 + Retry-After,
# checked after the idempotency lookup. The tenant's queued counter moves when
# a submit commits, so these tests commit for real.
backpressure = pytest.mark.django_db(transaction=True)


@pytest.fixture
def full_tenant(tenant):
    """A tenant whose queue holds one run, its limit."""
    tenant.max_queued = 1
    tenant.save(update_fields=["max_queued"])
    return tenant


@backpressure
def test_a_full_tenant_queue_answers_429_with_retry_after(api, full_tenant):
    assert post_run(api, ECHO).status_code == 202

    response = post_run(api, ECHO)

    body = assert_error(response, 429)
    assert "queue" in body["detail"]
    assert int(response["Retry-After"]) >= 1
    assert Run.objects.count() == 1


@backpressure
def test_only_queued_runs_count_against_max_queued(api, full_tenant):
    finished = post_run(api, ECHO).json()["id"]
    assert post_run(api, ECHO).status_code == 429

    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()
    assert Run.objects.get(id=finished).status == "done"

    assert post_run(api, ECHO).status_code == 202


@backpressure
def test_a_retried_submit_gets_its_run_even_when_the_queue_is_full(api, full_tenant):
    first = post_run(api, {**ECHO, "idempotency_key": "once"})
    assert post_run(api, {**ECHO, "idempotency_key": "other"}).status_code == 429

    again = post_run(api, {**ECHO, "idempotency_key": "once"})

    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"]


@backpressure
def test_submit_run_applies_the_same_backpressure(full_tenant):
    runs.submit_run(tenant=full_tenant, kind="echo", input={"text": "a"})

    with pytest.raises(QueueFull):
        runs.submit_run(tenant=full_tenant, kind="echo", input={"text": "b"})
    assert Run.objects.count() == 1


# --- submit_run inside the caller's transaction -------------------------------


class Boom(Exception):
    pass


@pytest.mark.django_db(transaction=True)
def test_submit_run_rolls_back_with_the_callers_transaction(tenant):
    with pytest.raises(Boom), transaction.atomic():
        run = runs.submit_run(tenant=tenant, kind="echo", input={"text": "order 42"})
        assert Run.objects.filter(id=run.id).exists()
        raise Boom

    assert not Run.objects.filter(id=run.id).exists()
    assert Event.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_submit_run_commits_with_the_callers_transaction(tenant):
    with transaction.atomic():
        run = runs.submit_run(tenant=tenant, kind="echo", input={"text": "order 42"})

    stored = Run.objects.get(id=run.id)
    assert stored.status == "queued"
    assert list(Event.objects.filter(run=stored).values_list("type", flat=True)) == ["run.queued"]


@pytest.mark.django_db(transaction=True)
def test_submit_run_idempotency_hit_inside_a_transaction_returns_the_run(tenant):
    first = runs.submit_run(
        tenant=tenant, kind="echo", input={"text": "a"}, idempotency_key="job-1"
    )
    with transaction.atomic():
        again = runs.submit_run(
            tenant=tenant, kind="echo", input={"text": "a"}, idempotency_key="job-1"
        )

    assert again.id == first.id
    assert Run.objects.count() == 1


# --- validation -----------------------------------------------------------------


@pytest.mark.usefixtures("no_new_runs")
class TestValidation:
    def test_unknown_kind_is_422_naming_the_kind(self, api):
        body = assert_error(post_run(api, {"kind": "no_such_agent", "input": {}}), 422)
        assert "no_such_agent" in body["detail"]

    def test_input_above_the_schema_maximum_is_422_with_errors(self, api):
        body = assert_error(
            post_run(api, {"kind": "echo", "input": {"text": "x", "times": 50}}), 422
        )
        assert "times" in body["detail"]
        assert [err["loc"] for err in body["errors"]] == [["times"]]

    def test_input_missing_a_required_field_is_422_with_errors(self, api):
        body = assert_error(post_run(api, {"kind": "echo", "input": {"times": 2}}), 422)
        assert "text" in body["detail"]
        assert body["errors"][0]["loc"] == ["text"]
        assert body["errors"][0]["type"] == "missing"

    def test_missing_kind_is_422(self, api):
        body = assert_error(post_run(api, {"input": {"text": "x"}}), 422)
        assert "kind" in body["detail"]
        assert body["errors"]

    @pytest.mark.parametrize("priority", [10, -1])
    def test_priority_outside_0_to_9_is_422(self, api, priority):
        body = assert_error(post_run(api, {**ECHO, "priority": priority}), 422)
        assert "priority" in body["detail"]
        assert any("priority" in err["loc"] for err in body["errors"])

    def test_max_attempts_zero_is_422(self, api):
        body = assert_error(post_run(api, {**ECHO, "max_attempts": 0}), 422)
        assert "max_attempts" in body["detail"]

    @pytest.mark.parametrize("queue", ["Bad Queue!", "-leading-dash", "UPPER"])
    def test_invalid_queue_name_is_422(self, api, queue):
        body = assert_error(post_run(api, {**ECHO, "queue": queue}), 422)
        assert "queue" in body["detail"]

    def test_input_that_is_not_an_object_is_422(self, api):
        body = assert_error(post_run(api, {"kind": "echo", "input": ["text"]}), 422)
        assert "input" in body["detail"]

    @pytest.mark.parametrize("raw", ["{not json", "", "[1, 2]", '"a string"', "null"])
    def test_a_body_that_is_not_a_json_object_is_a_json_4xx(self, api, raw):
        response = post_run(api, raw)

        assert 400 <= response.status_code < 500
        assert_error(response, response.status_code)

    def test_body_over_the_size_limit_is_413(self, api, settings):
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 200
        body = {"kind": "echo", "input": {"text": "x" * 500}}

        response = post_run(api, body)

        detail = assert_error(response, 413)["detail"]
        assert "larger than the limit" in detail


# --- auth -----------------------------------------------------------------------


@pytest.mark.usefixtures("no_new_runs")
class TestSubmitAuth:
    def test_no_authorization_header_is_401(self, db):
        body = assert_error(post_run(Client(), ECHO), 401)
        assert "Bearer" in body["detail"]

    def test_unknown_key_is_401(self, tenant):
        assert_error(post_run(client_for("ak_00000000_not-a-real-key"), ECHO), 401)

    def test_revoked_key_is_401(self, api, api_key):
        ApiKey.objects.update(revoked_at=timezone.now())

        assert_error(post_run(api, ECHO), 401)

    def test_key_in_a_non_bearer_scheme_is_401(self, api_key):
        assert_error(post_run(Client(headers={"Authorization": f"Basic {api_key}"}), ECHO), 401)

    def test_key_without_write_scope_is_403(self, tenant):
        read_only = create_api_key(tenant=tenant, name="ro", scopes=[ApiKey.Scope.READ]).secret

        body = assert_error(post_run(client_for(read_only), ECHO), 403)
        assert "runs:write" in body["detail"]

    def test_auth_is_checked_before_validation(self, db):
        """An anonymous caller learns nothing about kinds: 401 before 422."""
        assert_error(post_run(Client(), {"kind": "no_such_agent"}), 401)


def test_last_used_at_is_written_on_first_use_then_at_most_once_a_minute(api, api_key):
    key = ApiKey.objects.get()
    assert key.last_used_at is None

    post_run(api, ECHO)
    key.refresh_from_db()
    first_use = key.last_used_at
    assert first_use is not None

    api.get("/api/runs")
    key.refresh_from_db()
    assert key.last_used_at == first_use


def test_last_used_at_is_refreshed_after_a_minute(api):
    long_ago = timezone.now() - timedelta(minutes=5)
    ApiKey.objects.update(last_used_at=long_ago)

    assert api.get("/api/runs").status_code == 200

    assert ApiKey.objects.get().last_used_at > long_ago + timedelta(minutes=4)


@pytest.mark.parametrize("priority", [True, "5", 2.0])
def test_priority_must_be_a_json_integer(api, priority):
    body = assert_error(post_run(api, {**ECHO, "priority": priority}), 422)
    assert "priority" in body["detail"]
    assert Run.objects.count() == 0
