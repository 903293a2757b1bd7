"""Who may act on a run through the API: scopes (runs:write, runs:approve), tenants, authentication.

Precedence: 401 for a missing, unknown or revoked key; then 404
for another tenant's run; then 403 for a missing scope; then 409.
"""

from __future__ import annotations

import pytest
from django.test import Client

from runs.models import ApiKey, Message
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.control_helpers import (
    Person,
    act,
    ambiguous_run,
    approval_run,
    burst_worker,
    chat_run,
)
from tests.support.factories import TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)

ENDPOINTS = {
    "cancel": None,
    "pause": None,
    "resume": None,
    "approve": {"comment": "ok"},
    "reject": {"comment": "no"},
    "resolve": {"action": "fail"},
    "messages": {"text": "hello"},
    "retry": {},
}


def test_a_key_without_runs_approve_cannot_decide_but_can_cancel(tenant, api_person, tmp_path):
    writer = Person(tenant, "writer", [ApiKey.Scope.READ, ApiKey.Scope.WRITE])
    approval = approval_run(tenant, str(tmp_path / "a.log"))
    ambiguous = ambiguous_run(tenant, str(tmp_path / "b.log"))

    for run, action, body in [
        (approval, "approve", {}),
        (approval, "reject", {}),
        (ambiguous, "resolve", {"action": "done", "output": 1}),
    ]:
        before = fresh(run)
        response = act(writer.client, run, action, body)
        assert response.status_code == 403, (action, response.content)
        assert "runs:approve" in response.json()["detail"]
        after = fresh(run)
        assert (after.status, after.last_event_seq) == ("waiting_human", before.last_event_seq)

    assert act(writer.client, approval, "cancel").status_code == 200
    writer.did(approval, "run.cancelled")
    assert (
        act(api_person.client, ambiguous, "resolve", {"action": "done", "output": 1}).status_code
        == 200
    )


def test_a_key_without_runs_write_cannot_control_runs(tenant, api_person, tmp_path):
    approver = Person(tenant, "approver", [ApiKey.Scope.READ, ApiKey.Scope.APPROVE])
    queued = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})
    waiting = chat_run(tenant)
    broken = submit_run(tenant=tenant, kind="broken", input={})
    burst_worker()
    paused = submit_run(tenant=tenant, kind="echo", input={"text": "later"})
    act(api_person.client, paused, "pause")
    cases = [
        (queued, "cancel"),
        (queued, "pause"),
        (paused, "resume"),
        (waiting, "messages"),
        (broken, "retry"),
    ]

    for run, action in cases:
        before = fresh(run)
        response = act(approver.client, run, action, ENDPOINTS[action])
        assert response.status_code == 403, (action, response.content)
        assert "runs:write" in response.json()["detail"]
        after = fresh(run)
        assert (after.status, after.last_event_seq) == (before.status, before.last_event_seq)
    assert not Message.objects.filter(run=waiting).exists()
    assert approver.key.has_scope(ApiKey.Scope.APPROVE)


def test_another_tenants_run_is_404_for_every_control_endpoint(tenant, api_person, tmp_path):
    run = approval_run(tenant, str(tmp_path / "exec.log"))
    other = TenantFactory()
    stranger = Person(other, "stranger")
    no_scopes = Person(other, "reader", [ApiKey.Scope.READ])
    before = fresh(run)

    for action, body in ENDPOINTS.items():
        assert act(stranger.client, run, action, body).status_code == 404, action
        # 404 comes before 403: a key without the scope learns nothing about the run either.
        assert act(no_scopes.client, run, action, body).status_code == 404, action
    after = fresh(run)
    assert (after.status, after.last_event_seq) == ("waiting_human", before.last_event_seq)
    assert not Message.objects.filter(run=run).exists()


def test_control_endpoints_need_a_key(tenant, api_person, tmp_path):
    run = approval_run(tenant, str(tmp_path / "exec.log"))
    revoked = Person(tenant, "revoked")
    ApiKey.objects.filter(pk=revoked.key.pk).update(revoked_at=fresh(run).created_at)

    for action, body in ENDPOINTS.items():
        assert act(Client(), run, action, body).status_code == 401, action
        assert act(revoked.client, run, action, body).status_code == 401, action
    assert fresh(run).status == "waiting_human"
