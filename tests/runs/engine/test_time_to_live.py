"""Time to live (``expires_in`` on submit): a run that has not started by then never starts.

Real ``runworker`` and ``reap`` processes where processes matter.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.control import retry_run
from runs.events import Actor
from runs.exceptions import InvalidRunInput
from runs.models import Event, Run
from runs.services import submit_run
from tests.support.agents import executions
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until

processes_db = pytest.mark.django_db(transaction=True)


@processes_db
def test_a_run_past_expires_in_fails_expired_without_being_claimed(processes, tmp_path):
    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    tenant = TenantFactory(max_running=1)
    # The tenant's one slot is taken by a run that blocks until the test lets it go.
    busy = submit_run(
        tenant=tenant,
        kind="steps",
        input={"steps": 1, "block_at": 1, "block_file": str(block), "log": log},
    )
    processes.worker("--concurrency", "4", "--poll", "0.1")
    wait_until(lambda: Run.objects.get(pk=busy.pk).status == "running", what="the slot taken")
    stale = submit_run(tenant=tenant, kind="steps", input={"steps": 1, "log": log}, expires_in=1)
    patient = submit_run(tenant=tenant, kind="steps", input={"steps": 1, "log": log})
    assert stale.start_by is not None and patient.start_by is None
    time.sleep(1.2)  # the time to live itself runs out: nothing to wait for but the clock

    # The slot frees while the stale run is past its time to live: the worker takes the patient one.
    block.unlink()
    wait_until(lambda: Run.objects.get(pk=patient.pk).status == "done", what="the patient run done")
    assert Run.objects.get(pk=stale.pk).status == "queued"  # skipped by every claim, not started

    reaped = processes.run("reap", "--once")
    assert reaped.returncode == 0, reaped.stderr
    stale = Run.objects.get(pk=stale.pk)
    assert (stale.status, stale.error_kind) == ("failed", "expired")
    assert "expires_in" in stale.error
    assert (stale.attempt, stale.started_at, stale.claimed_at) == (0, None, None)
    assert str(stale.pk) not in {run_id for run_id, *_ in executions(log)}
    failed = Event.objects.get(run=stale, type="run.failed")
    assert failed.payload["reason"] == "expired"
    assert tenant.__class__.objects.get(pk=tenant.pk).queued == 0


@pytest.mark.django_db
def test_a_retried_expired_run_gets_a_new_life(tenant):
    run = submit_run(tenant=tenant, kind="steps", input={"steps": 1}, expires_in=60)
    Run.objects.filter(pk=run.pk).update(start_by=timezone.now() - timedelta(seconds=1))
    from runs.engine import reaping

    assert reaping.expire_unstarted(batch=10) == 1
    retry_run(run=Run.objects.get(pk=run.pk), actor=Actor(type="user", id="1"))
    run = Run.objects.get(pk=run.pk)
    assert (run.status, run.start_by) == ("queued", None)
    assert reaping.expire_unstarted(batch=10) == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    "expires_in, problem",
    [(0, "more than 0"), (-5, "more than 0"), (float("nan"), "more than 0"), ("5", "seconds")],
)
def test_a_bad_expires_in_is_refused_before_anything_is_written(tenant, expires_in, problem):
    with pytest.raises(InvalidRunInput, match=problem):
        submit_run(tenant=tenant, kind="steps", input={}, expires_in=expires_in)
    with pytest.raises(InvalidRunInput, match="before it may start"):
        submit_run(
            tenant=tenant,
            kind="steps",
            input={},
            expires_in=60,
            run_after=timezone.now() + timedelta(minutes=5),
        )
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_the_api_takes_expires_in_and_shows_start_by(api):
    answer = api.post(
        "/api/runs",
        json.dumps({"kind": "steps", "input": {"steps": 1}, "expires_in": 30}),
        content_type="application/json",
    )
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert body["start_by"] is not None
    for bad in (0, "30", True, 10**10):
        refused = api.post(
            "/api/runs",
            json.dumps({"kind": "steps", "input": {}, "expires_in": bad}),
            content_type="application/json",
        )
        assert refused.status_code == 422, (bad, refused.content)
        assert "expires_in" in refused.json()["detail"]
    assert Run.objects.count() == 1
