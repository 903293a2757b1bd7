"""Tenants see an error's exception lines, never the traceback with the server's paths; operators see it all
in the admin (issue 25, finding 11).
"""

from __future__ import annotations

import json
import os

import pytest
from django.test import Client

from runs.models import Event, Run, Step
from runs.services import submit_run
from runs.streams.hub import StoredEvent
from runs.streams.sse import format_event
from runs.webhooks.deliveries import body_for
from tests.conftest import ROOT, fresh
from tests.support.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

# The checkout as written and as resolved (.venv may be a link elsewhere).
CHECKOUT_PATHS = {str(ROOT), os.path.realpath(ROOT)}


def assert_trimmed(text: str, where: str) -> None:
    assert "Traceback" not in text, f"{where} shows a traceback"
    assert 'File "/' not in text and "File &quot;/" not in text, f"{where} shows frames"
    for path in CHECKOUT_PATHS:
        assert path not in text, f"{where} shows the checkout's path {path}"


@pytest.fixture
def failed_run(tenant, processes) -> Run:
    """A run whose step raised an exception the classifier does not know (fatal, traceback kept)."""
    run = submit_run(tenant=tenant, kind="flaky_call", input={"fail_times": 5, "error": "unknown"})
    result = processes.worker("--burst", "--concurrency", "1")
    result.wait(120)
    run = fresh(run)
    assert run.status == "failed", processes.output(result)
    # Stored whole, for operators.
    assert "Traceback (most recent call last)" in Step.objects.get(run=run, status="failed").error
    return run


def test_the_api_shows_the_exception_line_without_the_traceback(failed_run, api):
    body = api.get(f"/api/runs/{failed_run.pk}").json()
    steps = api.get(f"/api/runs/{failed_run.pk}/steps").json()["items"]
    listed = api.get("/api/runs").json()["items"]

    assert "InventoryGlitch: inventory service returned a negative stock level" in body["error"]
    assert_trimmed(json.dumps(body), "GET /api/runs/{id}")
    failed = [step for step in steps if step["error"]]
    assert failed and "inventory service returned a negative stock level" in failed[0]["error"]
    assert_trimmed(json.dumps(steps), "GET /api/runs/{id}/steps")
    assert_trimmed(json.dumps(listed), "GET /api/runs")


def test_the_dashboard_shows_the_exception_line_without_the_traceback(failed_run, tenant):
    client = Client()
    client.force_login(MembershipFactory(tenant=tenant, role="viewer").user)

    page = client.get(f"/runs/{failed_run.pk}/").content.decode()

    assert "inventory service returned a negative stock level" in page
    assert_trimmed(page, "the dashboard's run page")


def test_event_streams_and_webhooks_carry_the_trimmed_error(failed_run):
    event = Event.objects.filter(run=failed_run, type="step.failed").get()
    assert "Traceback" in event.payload["error"]  # stored as the step's error begins

    streamed = format_event(
        StoredEvent(
            run_id=failed_run.pk,
            seq=event.seq,
            type=event.type,
            actor_type=event.actor_type,
            actor_id=event.actor_id,
            payload_json=json.dumps(event.payload),
            created_at=event.created_at,
        )
    )
    # A webhook's body is built from the event it reports (run.failed carries the run's error, step.failed
    # the step's, which is the one with the traceback).
    webhook = body_for(
        event_type=event.type,
        seq=event.seq,
        at=event.created_at,
        actor_type=event.actor_type,
        actor_id=event.actor_id,
        payload=event.payload,
        run_id=str(failed_run.pk),
        kind=failed_run.kind,
        queue=failed_run.queue,
        tenant="t",
    )

    assert_trimmed(streamed, "the event stream")
    assert_trimmed(webhook, "the webhook body")
    assert "inventory service returned" in json.loads(webhook)["data"]["error"]


def test_the_admin_shows_operators_the_whole_traceback(failed_run):
    client = Client()
    client.force_login(UserFactory(is_staff=True, is_superuser=True))

    step = Step.objects.get(run=failed_run, status="failed")

    page = client.get(f"/admin/runs/step/{step.pk}/change/").content.decode()

    assert "Traceback (most recent call last)" in page
    assert any(f"File &quot;{path}/tests/support/agents.py" in page for path in CHECKOUT_PATHS)


def test_chained_and_cut_tracebacks_keep_their_exception_lines_only():
    from runs.errors import tenant_error  # here: the module is what this test looks for

    text = (
        "Boom: it broke\n\nTraceback (most recent call last):\n"
        f'  File "{ROOT}/runs/x.py", line 3, in f\n    {{}}["x"]\nKeyError: \'x\'\n\n'
        "The above exception was the direct cause of the following exception:\n\n"
        f'Traceback (most recent call last):\n  File "{ROOT}/runs/x.py", line 5, in g\n'
        "    raise Boom('it broke')\ntests.agents.Boom: it broke\n"
    )

    assert tenant_error(text) == "Boom: it broke\n\nKeyError: 'x'"
    assert (
        tenant_error(text[:80]) == "Boom: it broke"
    )  # cut inside a frame, as events keep 500 characters
    assert tenant_error(f"OSError: cannot read {ROOT}/.data/x") == "OSError: cannot read .data/x"
    assert tenant_error("the deadline of 3600 s passed") == "the deadline of 3600 s passed"
