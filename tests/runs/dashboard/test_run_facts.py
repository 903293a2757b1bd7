"""The run page's facts agree with its timeline: the step it names, its counters, its notes."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from runs.models import Run, Step
from runs.services import submit_run
from tests.support.factories import MembershipFactory
from tests.support.run_states import force_status

pytestmark = pytest.mark.django_db


@pytest.fixture
def approver():
    """A membership with the approver role, whose tenant the runs belong to."""
    return MembershipFactory(role="approver")


def page(approver, run) -> str:
    client = Client()
    client.force_login(approver.user)
    return client.get(f"/runs/{run.id}/").content.decode()


def fact(html: str, testid: str) -> tuple[str, str] | None:
    """(label, value) of the fact with this test id, or None."""
    found = re.search(rf'<dt>([^<]*)</dt><dd data-testid="{testid}">([^<]*)</dd>', html)
    return (found[1], found[2]) if found else None


def steps_run(approver, **fields) -> Run:
    return force_status(
        submit_run(tenant=approver.tenant, kind="steps", input={"steps": 3}), **fields
    )


def test_between_steps_the_page_names_the_last_finished_step_as_such(approver):
    run = steps_run(approver, status="running", current_step="step1", steps_done=1)
    Step.objects.create(run=run, seq=1, name="step1", status="done")
    assert fact(page(approver, run), "current-step") == ("Last step", "step1")


def test_a_slow_step_announced_before_its_row_exists_is_the_current_one(approver):
    run = steps_run(approver, status="running", current_step="step2", steps_done=1)
    Step.objects.create(run=run, seq=1, name="step1", status="done")
    assert fact(page(approver, run), "current-step") == ("Current step", "step2")


def test_a_side_effect_written_ahead_is_the_current_one(approver):
    run = steps_run(approver, status="running", current_step="charge", steps_done=1)
    Step.objects.create(run=run, seq=1, name="charge", status="running")
    assert fact(page(approver, run), "current-step") == ("Current step", "charge")


def test_a_waiting_run_names_what_it_waits_on(approver):
    run = steps_run(approver, status="waiting_human", current_step="Approve it", steps_done=1)
    Step.objects.create(run=run, seq=1, name="Approve it", kind="approval", status="waiting")
    assert fact(page(approver, run), "current-step") == ("Waiting on", "Approve it")


def test_a_paused_run_shows_paused_without_a_pause_requested_note(approver):
    run = steps_run(
        approver, status="paused", pause_requested_at=timezone.now(), current_step="step1"
    )
    html = page(approver, run)
    assert 'data-testid="status">Paused</span>' in html
    assert "pause requested" not in html.lower()
    # ... while a running run that was asked to pause says so.
    running = steps_run(approver, status="running", pause_requested_at=timezone.now())
    assert "pause requested" in page(approver, running)


def test_failed_tries_show_only_once_something_failed(approver):
    claimed_again = steps_run(approver, status="queued", attempt=2, failures=0)
    assert fact(page(approver, claimed_again), "failed-tries") is None
    failing = steps_run(approver, status="queued", attempt=2, failures=1, error="timeout")
    assert fact(page(approver, failing), "failed-tries") == ("Failed tries", "1 of 3 failed")


def test_money_under_a_cent_keeps_two_significant_digits(approver):
    run = steps_run(
        approver,
        status="done",
        cost_cents=Decimal("0.004213"),
        cost_ceiling_cents=Decimal("0.0025"),
    )
    html = page(approver, run)
    assert '<dd data-testid="cost">0.0042¢ of 0.0025¢ ceiling' in html
    assert "&lt; 0.01" not in html and "< 0.01" not in html


def test_staff_get_a_link_to_the_run_in_the_admin_and_others_do_not(approver):
    run = steps_run(approver, status="queued")
    assert "Open in the admin" not in page(approver, run)
    approver.user.is_staff = True
    approver.user.save(update_fields=["is_staff"])
    assert f'href="/admin/runs/run/{run.id}/change/">Open in the admin</a>' in page(approver, run)


@pytest.mark.parametrize(
    ("search", "is_id"),
    [
        ("3f2a", True),
        ("DEADBEEF", True),
        ("0b1c-4d", True),
        ("cafe", False),
        ("decade", False),
        ("acme renewal", False),
        ("3f2z", False),
    ],
)
def test_the_list_search_tells_a_run_id_from_words(search, is_id):
    from runs.dashboard.forms import RunFilterForm

    form = RunFilterForm({"q": search}, kinds=[])
    assert form.is_valid()
    assert (form.id_search is not None) == is_id
