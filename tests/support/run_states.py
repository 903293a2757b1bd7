"""Runs put in a given state without executing them (test setup only, no worker needed).

The API and dashboard tests of bad input need one run per state an endpoint
acts on: queued, waiting (for a message), waiting for an approval, waiting
for a person to resolve an ambiguous step, failed.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.utils import timezone

from runs.models import Run, Step
from runs.services import submit_run
from tests.conftest import fresh


def force_status(run: Run, status: str, **fields) -> Run:
    """Write the status (and a lease for ``running``) straight to the row."""
    if status == "running":
        fields.update(
            lease_token=1,
            locked_by=uuid.uuid4(),
            locked_until=timezone.now() + timedelta(minutes=5),
            started_at=fields.get("started_at", timezone.now()),
        )
    else:
        fields.update(lease_token=None, locked_by=None, locked_until=None)
    Run.objects.filter(pk=run.pk).update(status=status, **fields)
    return fresh(run)


def queued(tenant) -> Run:
    return submit_run(tenant=tenant, kind="echo", input={"text": "hi"})


def waiting_for_a_message(tenant) -> Run:
    return force_status(submit_run(tenant=tenant, kind="chat", input={}), "waiting", attempt=1)


def waiting_for_approval(tenant) -> Run:
    """The second step waits for an approver, as ``ctx.approval`` leaves it."""
    run = submit_run(tenant=tenant, kind="approve_then_act", input={})
    Step.objects.create(run=run, seq=1, name="draft", status="done", output={"amount": 42})
    Step.objects.create(
        run=run,
        seq=2,
        name="pay",
        kind="approval",
        status="waiting",
        input={"proposal": {"amount": 42}},
    )
    return force_status(run, "waiting_human", steps_done=1, current_step="pay", attempt=1)


def waiting_for_resolution(tenant) -> Run:
    """A side effect that may or may not have happened waits for a person."""
    run = submit_run(tenant=tenant, kind="effect", input={"log": "/dev/null"})
    Step.objects.create(
        run=run,
        seq=1,
        name="charge",
        kind="tool",
        status="waiting",
        input={"args": [42]},
        error="the worker died while the charge was in flight",
    )
    return force_status(run, "waiting_human", current_step="charge", attempt=1)


def failed(tenant, **fields) -> Run:
    fields = {"error": "boom", "error_kind": "fatal", **fields}
    return force_status(queued(tenant), "failed", finished_at=timezone.now(), **fields)


BUILDERS = {
    "queued": queued,
    "waiting": waiting_for_a_message,
    "approval": waiting_for_approval,
    "ambiguous": waiting_for_resolution,
    "failed": failed,
    "failed_on_budget": lambda tenant: failed(tenant, error="over budget", error_kind="budget"),
    "failed_on_deadline": lambda tenant: failed(
        tenant, error="out of time", error_kind="deadline", running_seconds=60, deadline_seconds=60
    ),
}


def build(tenant, state: str) -> Run:
    """A run of the tenant in ``state``, one of ``BUILDERS``."""
    return BUILDERS[state](tenant)


def one_of_each(tenant) -> dict[str, Run]:
    return {state: build(tenant, state) for state in BUILDERS}
