"""Terminal bounds (README.md, "When things go wrong"): deadline, step limits, cost ceiling, expires_at, the daily cost cap.

Each bound ends the run with its own error_kind, and neither the reaper nor
a worker retries it afterwards.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from runs.engine import claim as claims
from runs.engine import fleet
from runs.engine import steps as checkpoint
from runs.models import Event, Run, Step, StepAttempt, Tenant, TenantDailyCost
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions, notes
from tests.support.factories import TenantFactory
from tests.support.failure_helpers import Stepper, assert_left_alone, burst_worker, drive
from tests.support.waiting import wait_until
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)


def spent_today(tenant) -> Decimal:
    with connection.cursor() as cursor:
        cursor.execute("SELECT (statement_timestamp() AT TIME ZONE 'UTC')::date")
        today = cursor.fetchone()[0]
    return TenantDailyCost.objects.get(tenant=tenant, day=today).cost_cents


class TestDeadline:
    def test_a_run_that_uses_up_its_running_time_fails(self, tenant, tmp_path):
        log = str(tmp_path / "exec.log")
        run = submit_run(
            tenant=tenant,
            kind="steps",
            input={"steps": 10, "log": log, "step_seconds": 0.4},
            deadline_seconds=1,
        )
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind) == ("failed", "deadline")
        assert "deadline" in run.error
        # Two 0.4 s steps fit in a second, a third does not: it is cut short.
        assert run.steps_done == 2
        assert [seq for _, seq, _, _ in executions(log)] in ([1, 2], [1, 2, 3])
        assert 1.0 <= run.running_seconds < 2.5
        assert Tenant.objects.get(pk=tenant.pk).running == 0
        assert_left_alone(run)

    def test_the_reaper_stops_a_live_run_past_its_deadline(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={}, deadline_seconds=1)
        stepper = Stepper()  # claims like a worker whose run is stuck between steps
        fleet.register_worker(  # and is alive: its row and its lease
            worker_id=stepper.worker.id, queues=["default"], kinds=[], concurrency=1, lease=60
        )
        [claimed] = stepper.claim()
        held = {claimed.lease_token: run.pk}
        wait_until(  # by the database's clock, as the reaper judges
            lambda: Run.objects.filter(
                pk=run.pk, claimed_at__lt=Now() - timedelta(seconds=run.deadline_seconds)
            ).exists(),
            timeout=10,
            what="the run to be past its deadline",
        )
        reaper = Reaper()
        # Its worker is alive: the lease is fresh, so there is nothing to rescue...
        assert claims.heartbeat(worker_id=stepper.worker.id, held=held, lease=60) == {
            claimed.lease_token: (False, False)
        }
        assert reaper.find_expired() == []
        # ...but the run is over its running time.
        assert [stale.run_id for stale in reaper.find_past_deadline()] == [run.pk]
        report = reaper.reap_once()
        assert (report.deadline, report.rescued, report.failed) == (1, 0, 0)

        run = fresh(run)
        assert (run.status, run.error_kind, run.lease_token) == ("failed", "deadline", None)
        assert run.running_seconds >= 1
        event = Event.objects.filter(run=run).latest("seq")
        assert (event.type, event.actor_type, event.payload["reason"]) == (
            "run.failed",
            "system",
            "deadline",
        )
        assert Tenant.objects.get(pk=tenant.pk).running == 0
        # The worker finds out at its next heartbeat that reads its runs (the reaper's control
        # notice asks for one) or at its next checkpoint, and writes nothing.
        assert claims.heartbeat(worker_id=stepper.worker.id, held=held, lease=60) == {
            claimed.lease_token: (False, False)  # its own lease holds: no run read...
        }
        assert claims.heartbeat(worker_id=stepper.worker.id, held=held, lease=60, check=True) == {}
        record = checkpoint.StepRecord(
            run_id=run.pk,
            token=claimed.lease_token,
            generation=1,
            seq=1,
            name="one",
            kind="custom",
            input=None,
            started_at=datetime.now(UTC),
        )
        assert (
            checkpoint.checkpoint(
                checkpoint.Checkpoint.of(record, output=None, steps_total=None),
                worker_id=stepper.worker.id,
                lease=60,
            )
            is None
        )
        assert not Step.objects.filter(run=run).exists()
        assert_left_alone(run)


class TestStepLimits:
    def test_max_steps_stops_the_run_after_its_limit(self, tenant, tmp_path):
        log = str(tmp_path / "steps.log")
        run = submit_run(tenant=tenant, kind="limited_steps", input={"log": log, "steps": 10})
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind, run.steps_done) == ("failed", "step_limit", 5)
        assert "limit of 5 steps" in run.error
        assert [n["seq"] for n in notes(log)] == [1, 2, 3, 4, 5]
        assert Step.objects.filter(run=run).count() == 5
        assert_left_alone(run)

    def test_max_model_iterations_counts_model_calls(self, tenant, tmp_path):
        log = str(tmp_path / "loop.log")
        run = submit_run(tenant=tenant, kind="llm_loop", input={"log": log, "steps": 10})
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind) == ("failed", "step_limit")
        assert "limit of 3 model calls" in run.error
        # Three model calls and the tool call after each; the fourth model call never starts.
        assert list(Step.objects.filter(run=run).values_list("name", "kind")) == [
            ("model1", "llm"),
            ("tool1", "tool"),
            ("model2", "llm"),
            ("tool2", "tool"),
            ("model3", "llm"),
            ("tool3", "tool"),
        ]
        assert [n["step"] for n in notes(log)] == ["model", "tool"] * 3
        assert_left_alone(run)


class TestMoney:
    def test_the_step_that_crosses_the_cost_ceiling_is_the_last(self, tenant, tmp_path):
        """30-cent steps under a 100-cent ceiling: four steps run, the run fails at 120."""
        log = str(tmp_path / "calls.log")
        run = submit_run(
            tenant=tenant,
            kind="spender",
            input={"log": log, "steps": 10, "cents": 30},
            cost_ceiling_cents=100,
        )
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind, run.steps_done, run.cost_cents) == (
            "failed",
            "budget",
            4,
            120,
        )
        assert "over its ceiling" in run.error
        assert list(Step.objects.filter(run=run).values_list("cost_cents", flat=True)) == [30] * 4
        assert len(notes(log)) == 4
        assert spent_today(tenant) == 120
        assert_left_alone(run)

    def test_money_spent_by_failed_executions_is_kept(self, tenant, tmp_path):
        log = str(tmp_path / "calls.log")
        run = submit_run(
            tenant=tenant,
            kind="flaky_call",
            input={"log": log, "fail_times": 9, "cost_cents": 7},
            max_attempts=2,
        )
        [run] = drive([run])
        assert (run.status, run.error_kind, run.cost_cents) == ("failed", "retryable", 14)
        attempts = StepAttempt.objects.filter(run=run).order_by("attempt")
        assert [(a.attempt, a.cost_cents, a.tokens_in) for a in attempts] == [
            (1, 7, 1000),
            (2, 7, 1000),
        ]
        call = Step.objects.get(run=run, name="call")
        assert (call.cost_cents, call.tokens_in, call.tokens_out) == (14, 2000, 40)
        assert spent_today(tenant) == 14

    @pytest.mark.parametrize("max_attempts", [1, 3])
    def test_a_failed_execution_that_crosses_the_ceiling_ends_the_run_on_budget(
        self, tenant, tmp_path, max_attempts
    ):
        """The money a failed call cost counts at once: no retry, and the run says why it stopped."""
        log = str(tmp_path / "calls.log")
        run = submit_run(
            tenant=tenant,
            kind="flaky_call",
            input={"log": log, "fail_times": 9, "cost_cents": 150},
            cost_ceiling_cents=100,
            max_attempts=max_attempts,
        )
        [run] = drive([run])
        assert (run.status, run.error_kind, run.cost_cents) == ("failed", "budget", 150)
        assert run.attempt == 1
        assert len(notes(log, step="call")) == 1
        assert_left_alone(run)

    def test_a_tenant_over_its_daily_cost_cap_is_not_claimed_while_other_tenants_are(self, tenant):
        Tenant.objects.filter(pk=tenant.pk).update(daily_cost_cap_cents=50)
        spending = submit_run(tenant=tenant, kind="spender", input={"steps": 2, "cents": 30})
        burst_worker()
        # The cap stops claims, not a run already in flight.
        spending = fresh(spending)
        assert (spending.status, spending.cost_cents) == ("done", 60)
        assert spent_today(tenant) == 60

        other = TenantFactory()
        blocked = submit_run(tenant=tenant, kind="echo", input={"text": "mine"})
        theirs = submit_run(tenant=other, kind="echo", input={"text": "theirs"})
        stepper = Stepper()
        claimed = stepper.claim()
        assert [c.id for c in claimed] == [theirs.pk]
        assert stepper.execute(claimed[0]) == "done"
        assert stepper.claim() == []
        assert (fresh(blocked).status, fresh(blocked).attempt) == ("queued", 0)

        # It is the cap that holds the run: with room under it, the run goes.
        Tenant.objects.filter(pk=tenant.pk).update(daily_cost_cap_cents=100)
        burst_worker()
        assert fresh(blocked).status == "done"


def test_a_waiting_run_past_expires_at_is_failed_by_the_reaper(tenant, tmp_path):
    log = str(tmp_path / "send.log")
    runs = [
        submit_run(tenant=tenant, kind="slow_call", input={"log": log, "explicit_ambiguous": True})
        for _ in range(2)
    ]
    stepper = Stepper()
    assert [stepper.execute(claimed) for claimed in stepper.claim()] == ["waiting_human"] * 2
    stale, waiting = runs
    Run.objects.filter(pk=stale.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert Reaper().reap_once().expired == 1
    stale = fresh(stale)
    assert (stale.status, stale.error_kind) == ("failed", "expired")
    assert stale.finished_at is not None
    event = Event.objects.filter(run=stale).latest("seq")
    assert (event.type, event.actor_type, event.payload["error_kind"]) == (
        "run.failed",
        "system",
        "expired",
    )
    assert fresh(waiting).status == "waiting_human"  # its expires_at is days away
    assert_left_alone(stale)
