"""The dashboard's forms answer input PostgreSQL cannot store with a form error (422), never a 500.

Form posts arrive as UTF-8 text, so a lone surrogate can only come inside
a JSON text box, as the escape "\\ud800"; a NUL arrives either way.
"""

from __future__ import annotations

import pytest
from django.test import Client

import tests.support.agents_dashboard  # noqa: F401  (registers support_reply in this process)
from runs.models import Event, Message, Run, Step
from tests.support import run_states
from tests.support.factories import MembershipFactory

DEEP = "[" * 10_000 + "]" * 10_000


@pytest.fixture
def approver(db):
    membership = MembershipFactory(role="approver")
    client = Client()
    client.force_login(membership.user)
    client.tenant = membership.tenant
    return client


def assert_form_error(response, text: str = "") -> str:
    assert response.status_code == 422, response.status_code
    html = response.content.decode()
    assert 'class="field-error"' in html or 'data-testid="form-errors"' in html, html[-2000:]
    assert text in html
    return html


JSON_INPUTS = [
    pytest.param('{"log": "a\\u0000b"}', "NUL", id="nul-escape"),
    pytest.param('{"log": "\\ud800"}', "surrogate", id="lone-surrogate-escape"),
    pytest.param('{"\\u0000": 1}', "NUL", id="nul-in-a-key"),
    pytest.param('{"log": NaN}', "finite", id="nan"),
    pytest.param('{"log": 1e400}', "finite", id="number-beyond-float"),
    pytest.param('{"log": ' + "[" * 100 + "]" * 100 + "}", "deeper", id="100-levels-deep"),
    pytest.param('{"log": ' + DEEP + "}", "", id="10000-levels-deep"),
]


@pytest.mark.parametrize("text, reason", JSON_INPUTS)
def test_the_submit_forms_json_box_refuses_what_cannot_be_stored(approver, text, reason):
    response = approver.post("/runs/new/?kind=approve_then_act", {"input-input": text})

    assert_form_error(response, reason)
    assert not Run.objects.exists()


def test_a_submit_form_text_field_with_a_nul_is_a_form_error(approver):
    data = {
        "input-customer": "ana@example.com",
        "input-order": "A-1001",
        "input-message": "Hi\x00",
        "input-tone": "friendly",
    }

    assert_form_error(
        approver.post("/runs/new/?kind=support_reply", data), "Null characters are not allowed."
    )
    assert not Run.objects.exists()


def test_a_forged_idempotency_key_the_database_cannot_store_is_replaced_by_a_fresh_one(approver):
    response = approver.post(
        "/runs/new/?kind=approve_then_act",
        {"input-input": '{"log": null}', "idempotency_key": "k\x00"},
    )

    assert response.status_code == 302
    key = Run.objects.get().idempotency_key
    assert len(key) == 32 and "\x00" not in key


def test_the_submit_page_of_a_kind_with_a_nul_is_a_404(approver):
    assert approver.get("/runs/new/?kind=echo%00").status_code == 404


def _unchanged(run, before) -> None:
    assert Run.objects.values().get(pk=run.pk) == before
    assert not Message.objects.filter(run=run).exists()
    assert Event.objects.filter(run=run).count() == before["last_event_seq"]


ACTION_FORMS = [
    pytest.param("waiting", "messages", {"text": "hi\x00"}, "Null characters", id="message-nul"),
    pytest.param(
        "approval",
        "approve",
        {"comment": "ok\x00", "step": "2"},
        "Null characters",
        id="approve-nul",
    ),
    pytest.param(
        "approval", "reject", {"comment": "no\x00", "step": "2"}, "Null characters", id="reject-nul"
    ),
    pytest.param(
        "failed_on_budget",
        "retry",
        {"cost_ceiling_cents": "1e40"},
        "digits",
        id="retry-ceiling-1e40",
    ),
    pytest.param(
        "failed_on_budget",
        "retry",
        {"cost_ceiling_cents": "1000000000000"},
        "digits",
        id="retry-ceiling-1e12",
    ),
    pytest.param(
        "failed_on_budget",
        "retry",
        {"cost_ceiling_cents": "NaN"},
        "Enter a number",
        id="retry-ceiling-nan",
    ),
    pytest.param(
        "failed_on_deadline",
        "retry",
        {"deadline_seconds": "1" + "0" * 30},
        "less than or equal",
        id="retry-deadline",
    ),
    pytest.param(
        "failed", "retry", {"from_step": "1" + "0" * 30}, "from_step", id="retry-from-step-huge"
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": '{"r": "\\u0000"}'},
        "NUL",
        id="resolve-output-nul",
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": '"\\udfff"'},
        "surrogate",
        id="resolve-output-surrogate",
    ),
    pytest.param(
        "ambiguous",
        "resolve",
        {"action": "done", "output": "[NaN]"},
        "finite",
        id="resolve-output-nan",
    ),
    pytest.param(
        "ambiguous", "resolve", {"action": "done", "output": DEEP}, "", id="resolve-output-deep"
    ),
]


@pytest.mark.parametrize("state, action, data, error", ACTION_FORMS)
def test_an_action_form_with_unstorable_input_is_a_form_error_and_changes_nothing(
    approver, state, action, data, error
):
    run = run_states.build(approver.tenant, state)
    before = Run.objects.values().get(pk=run.pk)
    steps_before = list(Step.objects.filter(run=run).values())

    response = approver.post(f"/runs/{run.id}/{action}/", data)

    assert_form_error(response, error)
    _unchanged(run, before)
    assert list(Step.objects.filter(run=run).values()) == steps_before


@pytest.mark.parametrize(
    "query", ["kind=%00", "status=%00", "q=%00", "cursor=%00", "cursor=garbage"]
)
def test_run_list_filters_with_garbage_render_the_list(approver, query):
    response = approver.get(f"/?{query}")

    assert response.status_code == 200
