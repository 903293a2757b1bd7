"""Fixtures and setup helpers of the operations console tests (tests/test_admin*.py)."""

from __future__ import annotations

import itertools
import uuid
from datetime import timedelta

from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.utils import timezone

from runs.models import TERMINAL_STATUSES, Event, Run, Step
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.factories import UserFactory

ACTION_PERMISSIONS = ["cancel_run", "retry_run", "requeue_run", "approve_run", "resolve_run"]
CHANGELIST = "/admin/runs/run/"
_tokens = itertools.count(1)


def staff_user(*codenames: str):
    """A staff member (not a superuser) holding exactly these runs permissions."""
    user = UserFactory(is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="runs", codename__in=codenames)
    )
    return user


def make_run(
    tenant, status: str = "queued", *, kind: str = "noop3", queue: str = "default", **fields
) -> Run:
    """Submit a run through the service, then (test setup only) put it in ``status`` without executing it."""
    run = submit_run(tenant=tenant, kind=kind, input={"note": "<b>untrusted</b>"}, queue=queue)
    return force(run, status, **fields)


def force(run: Run, status: str, **fields) -> Run:
    now = timezone.now()
    if status == "running":
        fields = {
            "lease_token": next(_tokens),
            "locked_by": uuid.uuid4(),
            "locked_until": now + timedelta(minutes=5),
            "claimed_at": now,
            "heartbeat_at": now,
            "started_at": now,
            "attempt": 1,
            **fields,
        }
    if status in TERMINAL_STATUSES:
        fields.setdefault("finished_at", now)
    Run.objects.filter(pk=run.pk).update(status=status, **fields)
    return fresh(run)


def add_steps(run: Run, count: int, *, status: str = "done", kind: str = "tool") -> list[Step]:
    return [
        Step.objects.create(
            run=run,
            seq=seq,
            name=f"step {seq}",
            kind=kind,
            status=status,
            tokens_in=100 * seq,
            tokens_out=10 * seq,
            cost_cents=seq,
            input={"seq": seq},
            output={"seq": seq},
        )
        for seq in range(1, count + 1)
    ]


def waiting_on(tenant, *, kind: str) -> tuple[Run, Step]:
    """A run waiting for a person: its last step is an approval (kind="approval") or an ambiguous side effect."""
    run = make_run(tenant, "waiting_human")
    step = Step.objects.create(
        run=run,
        seq=1,
        name="send invoice",
        kind=kind,
        status="waiting",
        input={"proposal": {"amount": 120}},
        error="the connection dropped after sending",
    )
    return run, step


def last_event(run: Run) -> Event:
    return Event.objects.filter(run=run).order_by("-seq").first()


def post_action(client, action: str, runs, url: str = CHANGELIST, **extra):
    """POST an admin action on the selected runs to the changelist, as the action bar does."""
    data = {"action": action, "_selected_action": [str(run.pk) for run in runs], **extra}
    return client.post(url, data)


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]
