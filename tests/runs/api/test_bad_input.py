"""Input PostgreSQL cannot store is a 4xx naming the field, never a 500, and writes nothing.

NUL characters and lone surrogates (text and jsonb refuse both), numbers
outside NUMERIC(18,6) or not finite (jsonb has no NaN), and nesting deeper
than ``runs.text.MAX_DEPTH``. Each case the issue lists is pinned here;
test_api_fuzz.py throws generated input at every endpoint.

Lone surrogates travel as JSON escapes: ``json.dumps(ensure_ascii=True)``
writes "\\ud800", which Python's JSON parser turns back into the lone
surrogate on the server.
"""

from __future__ import annotations

import json

import pytest
from django.db import DataError
from django.test import Client

from runs.models import Event, Message, Run, Step
from tests.support import run_states

NUL, SURROGATE, LOW_SURROGATE = "\u0000", "\ud800", "\udfff"
NAN, INF = float("nan"), float("inf")


def nested_lists(depth: int) -> str:
    """JSON text of ``depth`` nested lists (json.dumps itself would recurse too deep)."""
    return "[" * depth + "]" * depth


def raw(text: str) -> RawJSON:
    return RawJSON(text)


class RawJSON(str):
    """A body sent as it is, not through json.dumps."""


def encode(body) -> str:
    if isinstance(body, RawJSON):
        return str(body)
    return json.dumps(body, ensure_ascii=True, allow_nan=True)


def post(client, path: str, body, **headers):
    return client.post(path, data=encode(body), content_type="application/json", headers=headers)


def assert_4xx_naming(response, field: str, status: int = 422) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    detail = response.json()["detail"]
    assert isinstance(detail, str)
    assert field in detail, detail
    return detail


# --- POST /api/runs ---------------------------------------------------------------

NOOP = {"kind": "noop3", "input": {}}

SUBMIT_CASES = [
    pytest.param({**NOOP, "input": {"note": f"a{NUL}b"}}, {}, "input", id="input-value-nul"),
    pytest.param(
        {**NOOP, "input": {"items": ["ok", "fine", f"x{NUL}"]}},
        {},
        "input.items[2]",
        id="input-nested-value-nul",
    ),
    pytest.param({**NOOP, "input": {f"a{NUL}": 1}}, {}, "input", id="input-key-nul"),
    pytest.param(
        {**NOOP, "input": {"note": SURROGATE}}, {}, "input.note", id="input-value-surrogate"
    ),
    pytest.param(
        {**NOOP, "input": {"outer": {LOW_SURROGATE: 1}}},
        {},
        "input.outer",
        id="input-nested-key-surrogate",
    ),
    pytest.param({**NOOP, "input": {"x": NAN}}, {}, "input.x", id="input-nan"),
    pytest.param({**NOOP, "input": {"x": [1, INF]}}, {}, "input.x[1]", id="input-infinity"),
    pytest.param(
        raw('{"kind": "noop3", "input": {"x": 1e400}}'),
        {},
        "input.x",
        id="input-number-beyond-float",
    ),
    pytest.param(
        raw('{"kind": "noop3", "input": {"deep": ' + nested_lists(100) + "}}"),
        {},
        "input.deep",
        id="input-100-levels-deep",
    ),
    pytest.param({"kind": f"echo{NUL}", "input": {"text": "hi"}}, {}, "kind", id="kind-nul"),
    pytest.param({"kind": SURROGATE, "input": {}}, {}, "kind", id="kind-surrogate"),
    pytest.param({**NOOP, "queue": f"default{NUL}"}, {}, "queue", id="queue-nul"),
    pytest.param({**NOOP, "queue": SURROGATE}, {}, "queue", id="queue-surrogate"),
    pytest.param(
        {**NOOP, "idempotency_key": f"k{NUL}"}, {}, "idempotency_key", id="idempotency-key-nul"
    ),
    pytest.param(
        {**NOOP, "idempotency_key": SURROGATE},
        {},
        "idempotency_key",
        id="idempotency-key-surrogate",
    ),
    pytest.param(
        NOOP, {"Idempotency-Key": f"k{NUL}"}, "Idempotency-Key", id="idempotency-key-header-nul"
    ),
    pytest.param(
        {**NOOP, "callback_url": f"https://example.com/{NUL}"},
        {},
        "callback_url",
        id="callback-url-nul",
    ),
    pytest.param(
        {**NOOP, "callback_url": f"https://example.com/{SURROGATE}"},
        {},
        "callback_url",
        id="callback-url-surrogate",
    ),
    pytest.param(
        {**NOOP, "cost_ceiling_cents": 1e30}, {}, "cost_ceiling_cents", id="cost-ceiling-1e30"
    ),
    pytest.param(
        {**NOOP, "cost_ceiling_cents": 1e12}, {}, "cost_ceiling_cents", id="cost-ceiling-1e12"
    ),
    pytest.param(
        {**NOOP, "cost_ceiling_cents": INF}, {}, "cost_ceiling_cents", id="cost-ceiling-infinity"
    ),
    pytest.param(
        {**NOOP, "cost_ceiling_cents": NAN}, {}, "cost_ceiling_cents", id="cost-ceiling-nan"
    ),
]


@pytest.mark.parametrize("body, headers, field", SUBMIT_CASES)
def test_a_submit_with_unstorable_input_is_422_naming_the_field_and_writes_nothing(
    api, body, headers, field
):
    response = post(api, "/api/runs", body, **headers)

    assert_4xx_naming(response, field)
    assert not Run.objects.exists()
    assert not Event.objects.exists()


def test_input_nested_ten_thousand_levels_deep_is_a_4xx_not_a_recursion_error(api):
    response = post(
        api, "/api/runs", raw('{"kind": "noop3", "input": {"deep": ' + nested_lists(10_000) + "}}")
    )

    assert 400 <= response.status_code < 500, response.content
    assert isinstance(response.json()["detail"], str)
    assert not Run.objects.exists()


def test_the_largest_cost_ceiling_numeric_18_6_holds_is_accepted(api):
    response = post(api, "/api/runs", {**NOOP, "cost_ceiling_cents": 999_999_999_999.99})

    assert response.status_code == 202, response.content
    assert str(Run.objects.get().cost_ceiling_cents) == "999999999999.990000"


def test_text_with_ordinary_unicode_is_stored_as_sent(api):
    """Only what PostgreSQL refuses is refused: emoji (a surrogate pair in JSON), accents and U+FFFD pass."""
    note = "caf\u00e9 \U0001f600 \ufffd"

    response = post(api, "/api/runs", {**NOOP, "input": {"note": note}, "idempotency_key": note})

    assert response.status_code == 202, response.content
    run = Run.objects.get()
    assert (run.input, run.idempotency_key) == ({"note": note}, note)


# --- GET /api/runs ------------------------------------------------------------------

LIST_CASES = [
    pytest.param("kind=%00", "kind", id="kind-nul"),
    pytest.param("queue=%00", "queue", id="queue-nul"),
    pytest.param("queue=default%00x", "queue", id="queue-embedded-nul"),
    pytest.param("cursor=%00", "cursor", id="cursor-nul"),
    pytest.param("cursor=not-a-cursor", "cursor", id="cursor-garbage"),
    # Valid base64 of JSON that is not a cursor, and of a cursor whose id is not a UUID.
    pytest.param("cursor=eyJhIjogMX0", "cursor", id="cursor-json-object"),
    pytest.param(
        "cursor=WyIyMDI0LTAxLTAxVDAwOjAwOjAwKzAwOjAwIiwgIngiXQ", "cursor", id="cursor-bad-uuid"
    ),
    pytest.param("status=%00", "status", id="status-nul"),
    pytest.param("limit=1e999", "limit", id="limit-huge"),
]


@pytest.mark.parametrize("query, field", LIST_CASES)
def test_a_run_list_filter_postgresql_cannot_compare_is_422_naming_it(api, query, field):
    assert_4xx_naming(api.get(f"/api/runs?{query}"), field)


# --- actions on a run --------------------------------------------------------------

ACTION_CASES = [
    pytest.param("queued", "messages", {"text": f"hi{NUL}"}, "text", id="message-nul"),
    pytest.param("waiting", "messages", {"text": f"hi{SURROGATE}"}, "text", id="message-surrogate"),
    pytest.param(
        "failed_on_budget",
        "retry",
        {"cost_ceiling_cents": 1e40},
        "cost_ceiling_cents",
        id="retry-ceiling-1e40",
    ),
    pytest.param(
        "failed_on_budget",
        "retry",
        {"cost_ceiling_cents": NAN},
        "cost_ceiling_cents",
        id="retry-ceiling-nan",
    ),
    pytest.param(
        "failed_on_deadline",
        "retry",
        {"deadline_seconds": 10**12},
        "deadline_seconds",
        id="retry-deadline-huge",
    ),
    pytest.param(
        "approval", "approve", {"comment": f"ok{NUL}"}, "comment", id="approve-comment-nul"
    ),
    pytest.param(
        "approval", "approve", {"comment": SURROGATE}, "comment", id="approve-comment-surrogate"
    ),
    pytest.param("approval", "reject", {"comment": f"no{NUL}"}, "comment", id="reject-comment-nul"),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": {"receipt": f"r{NUL}"}},
        "output.receipt",
        id="resolve-output-nul",
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": [SURROGATE]},
        "output[0]",
        id="resolve-output-surrogate",
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": {"amount": NAN}},
        "output.amount",
        id="resolve-output-nan",
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": {f"k{NUL}": 1}},
        "output",
        id="resolve-output-key-nul",
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        raw('{"action": "done", "output": ' + nested_lists(100) + "}"),
        "output",
        id="resolve-output-100-levels-deep",
    ),
]


@pytest.mark.parametrize("state, action, body, field", ACTION_CASES)
def test_an_action_with_unstorable_input_is_422_naming_the_field_and_changes_nothing(
    api, tenant, state, action, body, field
):
    run = run_states.build(tenant, state)
    before = Run.objects.values().get(pk=run.pk)
    steps_before = list(Step.objects.filter(run=run).values())

    response = post(api, f"/api/runs/{run.id}/{action}", body)

    assert_4xx_naming(response, field)
    assert Run.objects.values().get(pk=run.pk) == before
    assert list(Step.objects.filter(run=run).values()) == steps_before
    assert not Message.objects.filter(run=run).exists()
    assert Event.objects.filter(run=run).count() == before["last_event_seq"]


def test_an_action_body_that_is_not_json_is_a_json_400(api, tenant):
    run = run_states.waiting_for_approval(tenant)

    response = post(api, f"/api/runs/{run.id}/approve", raw("{not json"))

    assert response.status_code == 400
    assert isinstance(response.json()["detail"], str)


def test_a_retry_with_the_largest_ceiling_numeric_18_6_holds_is_accepted(api, tenant):
    run = run_states.failed(tenant)

    response = post(api, f"/api/runs/{run.id}/retry", {"cost_ceiling_cents": 999_999_999_999.5})

    assert response.status_code == 200, response.content
    assert str(Run.objects.get(pk=run.pk).cost_ceiling_cents) == "999999999999.500000"


@pytest.mark.parametrize("token", [SURROGATE, f"ak_{NUL}", "ak_\u00e9"])
def test_a_bearer_token_that_is_no_key_of_ours_is_401_whatever_its_characters(db, token):
    response = Client(headers={"Authorization": f"Bearer {token}"}).get("/api/runs")

    assert_4xx_naming(response, "API key", status=401)


def test_an_unknown_api_path_is_a_json_404(api):
    response = api.get("/api/runs/not/a/route")

    assert response.status_code == 404
    assert isinstance(response.json()["detail"], str)


@pytest.mark.parametrize(
    "error",
    [
        DataError("numeric field overflow"),
        UnicodeEncodeError("utf-8", SURROGATE, 0, 1, "surrogates not allowed"),
    ],
)
def test_a_value_the_schemas_let_through_but_postgresql_refuses_is_a_422_not_a_500(
    api, monkeypatch, error
):
    """The last line behind the schemas: a gap in them shows as a 422 (and a warning), never a 500."""

    def refused(**kwargs):
        raise error

    monkeypatch.setattr("runs.api.endpoints.services.submit", refused)

    response = post(api, "/api/runs", NOOP)

    assert response.status_code == 422
    assert "cannot be" in response.json()["detail"]
