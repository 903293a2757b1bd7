"""Destructive buttons of the run page ask first: without JavaScript the server's confirmation page does.

The browser's dialog is tested in tests/runs/dashboard/test_tour.py.
"""

from __future__ import annotations

import pytest
from django.test import Client

from runs.models import Run
from runs.services import submit_run
from tests.support.factories import MembershipFactory
from tests.support.run_states import force_status, waiting_for_approval

pytestmark = pytest.mark.django_db


def logged_in(role: str = "approver"):
    member = MembershipFactory(role=role)
    client = Client()
    client.force_login(member.user)
    return client, member


def test_cancel_without_confirmation_shows_a_page_and_changes_nothing():
    client, member = logged_in()
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "keep me"})
    response = client.post(f"/runs/{run.id}/cancel/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="confirm-page"' in html and "Cancel this run?" in html
    assert Run.objects.get(pk=run.pk).status == "queued"
    # The page's own form carries the confirmation; posting it cancels.
    assert 'name="confirmed" value="1"' in html
    response = client.post(f"/runs/{run.id}/cancel/", {"confirmed": "1"})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).status == "cancelled"


def test_cancel_and_roll_back_keeps_its_choice_through_the_confirmation_page():
    client, member = logged_in()
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "x"}), "running"
    )
    html = client.post(f"/runs/{run.id}/cancel/", {"compensate": "1"}).content.decode()
    assert "Cancel and roll back this run?" in html
    assert '<input type="hidden" name="compensate" value="1">' in html


def test_reject_without_confirmation_keeps_the_comment_for_the_confirmed_post():
    client, member = logged_in()
    run = waiting_for_approval(member.tenant)
    comment = 'Not yet <b>"legal"</b>'
    response = client.post(f"/runs/{run.id}/reject/", {"comment": comment})
    assert response.status_code == 200
    html = response.content.decode()
    assert "Reject this proposal?" in html
    assert 'value="Not yet &lt;b&gt;&quot;legal&quot;&lt;/b&gt;"' in html  # escaped, carried along
    assert Run.objects.get(pk=run.pk).status == "waiting_human"
    response = client.post(f"/runs/{run.id}/reject/", {"comment": comment, "confirmed": "1"})
    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_approve_needs_no_confirmation():
    client, member = logged_in()
    run = waiting_for_approval(member.tenant)
    assert client.post(f"/runs/{run.id}/approve/", {"comment": ""}).status_code == 302
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_a_viewer_gets_403_not_a_confirmation_page():
    client, member = logged_in("viewer")
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "x"})
    assert client.post(f"/runs/{run.id}/cancel/").status_code == 403
