"""The queue's guarantees, in process against real PostgreSQL: claim, fencing, replay, the one exit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from django.db import connection
from django.utils import timezone

from runs.engine import claim as claims
from runs.engine import fleet
from runs.engine import steps as checkpoint
from runs.engine.exit import Exit, leave
from runs.models import Event, Run, Step, Tenant
from runs.models import Worker as WorkerRow
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.reaper import Reaper
from workers.worker import Worker, WorkerOptions

KINDS = {"steps": 1, "noop3": 1, "echo": 1, "flaky": 1, "broken": 1}
WORKER_ID = uuid4()


def claim(n=1, **kw):
    return claims.claim(worker_id=WORKER_ID, queues=["default"], kinds=KINDS, n=n, lease=60, **kw)


def burst_worker(**options):
    options = {
        "burst": True,
        "heartbeat": 1,
        "lease": 10,
        "listen": False,
        "concurrency": 2,
    } | options
    Worker(WorkerOptions(**options)).run()


def step_record(claimed, seq, name="step1"):
    return checkpoint.StepRecord(
        run_id=claimed.id,
        token=claimed.lease_token,
        generation=claimed.generation,
        seq=seq,
        name=name,
        kind="custom",
        input=None,
        started_at=datetime.now(UTC),
    )


def register(lease=60):
    """WORKER_ID's row, with a lease of ``lease`` seconds (what a worker process registers at start)."""
    fleet.register_worker(
        worker_id=WORKER_ID, queues=["default"], kinds=list(KINDS), concurrency=4, lease=lease
    )


def expire_lease(run_id):
    """The run's lease and its worker's (if it has a row) are over: the worker stopped heartbeating."""
    past = timezone.now() - timedelta(seconds=1)
    Run.objects.filter(pk=run_id).update(locked_until=past)
    WorkerRow.objects.filter(pk=WORKER_ID).update(lease_until=past)


@pytest.mark.django_db
class TestClaim:
    def test_claim_is_two_statements_and_takes_the_lease(self, tenant, django_assert_num_queries):
        assert claim() == []  # a process's first claim also reads which limits are in force
        run = submit_run(tenant=tenant, kind="noop3", input={})
        with django_assert_num_queries(2):  # the claim, then its counters (runs/sql/claim.sql)
            [claimed] = claim()
        run = fresh(run)
        assert claimed.id == run.id
        assert run.status == "running"
        assert run.lease_token == claimed.lease_token
        assert run.locked_by == WORKER_ID
        assert run.attempt == 1
        assert run.kind_version == 1
        assert Tenant.objects.get(pk=tenant.pk).running == 1
        assert list(Event.objects.filter(run=run).values_list("seq", "type")) == [
            (1, "run.queued"),
            (2, "run.running"),
        ]

    def test_every_claim_gets_a_new_token(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [first] = claim()
        assert leave(Exit.release(reason="test").of_run(run.id, first.lease_token))
        [second] = claim()
        assert second.lease_token > first.lease_token
        assert second.attempt == 2

    def test_claims_only_registered_kinds_and_own_queues(self, tenant):
        submit_run(tenant=tenant, kind="noop3", input={}, queue="long")
        submit_run(tenant=tenant, kind="echo", input={"text": "x"})
        claimed = claims.claim(
            worker_id=WORKER_ID, queues=["default"], kinds={"noop3": 1}, n=5, lease=60
        )
        assert claimed == []
        claimed = claims.claim(
            worker_id=WORKER_ID, queues=["long"], kinds={"noop3": 1}, n=5, lease=60
        )
        assert [c.kind for c in claimed] == ["noop3"]

    def test_tenant_limit_holds_and_other_tenants_still_claim(self, tenant):
        tenant.max_running = 2
        tenant.save()
        other = TenantFactory()
        for _ in range(5):
            submit_run(tenant=tenant, kind="noop3", input={})
        submit_run(tenant=other, kind="noop3", input={})
        claimed = claim(n=10)
        assert sorted(c.tenant_id == tenant.id for c in claimed) == [False, True, True]
        assert claim(n=10) == []
        assert Tenant.objects.get(pk=tenant.pk).running == 2

    def test_priority_then_started_runs_first(self, tenant):
        low = submit_run(tenant=tenant, kind="noop3", input={}, priority=9)
        fresh_run = submit_run(tenant=tenant, kind="noop3", input={}, priority=5)
        started = submit_run(tenant=tenant, kind="noop3", input={}, priority=5)
        Run.objects.filter(pk=started.pk).update(started_at=timezone.now() - timedelta(minutes=5))
        urgent = submit_run(tenant=tenant, kind="noop3", input={}, priority=0)
        order = [claim()[0].id for _ in range(4)]
        assert order == [urgent.id, started.id, fresh_run.id, low.id]

    def test_future_run_after_is_not_claimed(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        Run.objects.filter(pk=run.pk).update(run_after=timezone.now() + timedelta(minutes=1))
        assert claim() == []


@pytest.mark.django_db
class TestFencing:
    def test_checkpoint_is_one_statement(self, tenant, django_assert_num_queries):
        submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        with django_assert_num_queries(1):
            answer = checkpoint.checkpoint(
                checkpoint.Checkpoint.of(step_record(claimed, 1), output={"a": 1}, steps_total=3),
                worker_id=WORKER_ID,
                lease=60,
            )
        assert answer is not None
        run = Run.objects.get(pk=claimed.id)
        assert (run.steps_done, run.steps_total, run.current_step) == (1, 3, "step1")
        step = Step.objects.get(run=run)
        assert (step.status, step.output, step.executions) == ("done", {"a": 1}, 1)
        assert Event.objects.filter(run=run, type="step.done").count() == 1

    def test_worker_whose_lease_was_taken_over_cannot_checkpoint(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [old] = claim()
        expire_lease(run.id)
        assert Reaper().reap_once().rescued == 1
        [new] = claim()
        assert new.lease_token != old.lease_token

        answer = checkpoint.checkpoint(
            checkpoint.Checkpoint.of(step_record(old, 1), output="stale", steps_total=None),
            worker_id=WORKER_ID,
            lease=60,
        )
        assert answer is None
        assert not Step.objects.filter(run=run).exists()
        assert (
            checkpoint.record_step_failure(
                step_record(old, 1), error="x", error_kind="fatal", worker_id=WORKER_ID
            )
            is None
        )
        assert leave(Exit.done(result="1", reason="stale").of_run(run.id, old.lease_token)) is None
        run = fresh(run)
        assert (run.status, run.lease_token, run.steps_done) == ("running", new.lease_token, 0)
        # The new owner writes normally.
        assert checkpoint.checkpoint(
            checkpoint.Checkpoint.of(step_record(new, 1), output="fresh", steps_total=None),
            worker_id=WORKER_ID,
            lease=60,
        )
        assert Step.objects.get(run=run).output == "fresh"

    def test_a_done_step_is_never_overwritten(self, tenant):
        submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        assert checkpoint.checkpoint(
            checkpoint.Checkpoint.of(step_record(claimed, 1), output="first", steps_total=None),
            worker_id=WORKER_ID,
            lease=60,
        )
        checkpoint.checkpoint(
            checkpoint.Checkpoint.of(step_record(claimed, 1), output="second", steps_total=None),
            worker_id=WORKER_ID,
            lease=60,
        )
        assert Step.objects.get(run_id=claimed.id).output == "first"


@pytest.mark.django_db
class TestExit:
    def test_exit_clears_lease_gives_slot_back_and_records_time(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        Run.objects.filter(pk=run.pk).update(claimed_at=timezone.now() - timedelta(seconds=5))
        assert leave(Exit.done(result='{"ok": 1}').of_run(run.id, claimed.lease_token))[:2] == (
            "done",
            "default",
        )
        run = fresh(run)
        assert (run.status, run.result, run.lease_token, run.locked_by, run.locked_until) == (
            "done",
            {"ok": 1},
            None,
            None,
            None,
        )
        assert run.running_seconds >= 5
        assert run.finished_at is not None
        assert Tenant.objects.get(pk=tenant.pk).running == 0
        assert Event.objects.filter(run=run).last().type == "run.done"

    @pytest.mark.parametrize(
        ("flag", "expected"),
        [("cancel_requested_at", "cancelled"), ("pause_requested_at", "paused")],
    )
    def test_a_request_that_lands_while_parking_wins(self, tenant, flag, expected):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        Run.objects.filter(pk=run.pk).update(**{flag: timezone.now()})
        status, *_ = leave(Exit.release(reason="release").of_run(run.id, claimed.lease_token))
        assert status == expected
        assert fresh(run).status == expected

    def test_retry_that_spends_the_last_attempt_fails_the_run(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={}, max_attempts=1)
        [claimed] = claim()
        status, *_ = leave(
            Exit.retry(error="503", delay=0, error_class="HTTPError").of_run(
                run.id, claimed.lease_token
            )
        )
        assert status == "failed"
        run = fresh(run)
        assert (run.error_kind, run.failures, run.error) == ("retryable", 1, "503")

    def test_graceful_release_spends_no_attempt(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={}, max_attempts=1)
        [claimed] = claim()
        status, *_ = leave(Exit.release(reason="shutdown").of_run(run.id, claimed.lease_token))
        assert status == "queued"
        assert fresh(run).failures == 0


@pytest.mark.django_db
class TestReaper:
    def test_rescues_an_expired_lease_as_a_failed_attempt(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        claim()
        expire_lease(run.id)
        report = Reaper().reap_once()
        assert (report.rescued, report.failed) == (1, 0)
        run = fresh(run)
        assert (run.status, run.failures, run.lease_token) == ("queued", 1, None)
        assert Tenant.objects.get(pk=tenant.pk).running == 0

    def test_fails_a_run_whose_retry_budget_is_spent(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={}, max_attempts=1)
        claim()
        expire_lease(run.id)
        assert Reaper().reap_once().failed == 1
        run = fresh(run)
        assert (run.status, run.error_kind) == ("failed", "retryable")
        assert "lease expired" in run.error

    def test_leaves_a_live_lease_alone(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        claim()
        assert Reaper().reap_once().rescued == 0
        assert fresh(run).status == "running"

    def test_does_not_touch_a_run_that_finished_after_it_was_read(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        expire_lease(run.id)
        reaper = Reaper()
        [stale] = reaper.find_expired()
        # The slow worker finishes between the reaper's read and its write.
        assert leave(Exit.done(result='"r"').of_run(run.id, claimed.lease_token))
        assert reaper.rescue(stale) is None
        run = fresh(run)
        assert (run.status, run.result, run.failures) == ("done", "r", 0)

    def test_does_not_touch_a_run_reclaimed_after_it_was_read(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        claim()
        expire_lease(run.id)
        slow, fast = Reaper(), Reaper()
        [stale] = slow.find_expired()
        assert fast.reap_once().rescued == 1
        [reclaimed] = claim()
        assert slow.rescue(stale) is None
        run = fresh(run)
        assert (run.status, run.lease_token, run.failures) == ("running", reclaimed.lease_token, 1)

    def test_does_not_touch_a_run_heartbeated_after_it_was_read(self, tenant):
        register()
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        expire_lease(run.id)
        reaper = Reaper()
        [stale] = reaper.find_expired()
        assert claims.heartbeat(
            worker_id=WORKER_ID, held={claimed.lease_token: run.id}, lease=60
        ) == {claimed.lease_token: (False, False)}
        assert reaper.rescue(stale) is None
        assert fresh(run).status == "running"

    def test_reconciles_a_drifted_tenant_counter(self, tenant):
        submit_run(tenant=tenant, kind="noop3", input={})
        claim()
        Tenant.objects.filter(pk=tenant.pk).update(running=7)
        assert Reaper().reap_once().tenants_fixed == 1
        assert Tenant.objects.get(pk=tenant.pk).running == 1


@pytest.mark.django_db
def test_heartbeat_reports_flags_and_lost_leases(tenant):
    a = submit_run(tenant=tenant, kind="noop3", input={})
    b = submit_run(tenant=tenant, kind="noop3", input={})
    claimed = {c.id: c for c in claim(n=2)}
    Run.objects.filter(pk=a.pk).update(cancel_requested_at=timezone.now())
    expire_lease(b.id)
    Reaper().reap_once()
    held = {c.lease_token: run_id for run_id, c in claimed.items()}
    assert claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60) == {
        claimed[a.id].lease_token: (True, False)
    }


@pytest.mark.django_db(transaction=True)
class TestExecution:
    def test_replay_returns_recorded_steps_without_executing_them(self, tenant, tmp_path):
        log = str(tmp_path / "exec.log")
        run = submit_run(tenant=tenant, kind="steps", input={"steps": 5, "log": log})
        [claimed] = claim()
        for seq in (1, 2, 3):
            checkpoint.checkpoint(
                checkpoint.Checkpoint.of(
                    step_record(claimed, seq, f"step{seq}"),
                    output={"seq": seq, "name": f"step{seq}"},
                    steps_total=5,
                ),
                worker_id=WORKER_ID,
                lease=60,
            )
        leave(Exit.release(reason="test").of_run(run.id, claimed.lease_token))
        burst_worker()
        run = fresh(run)
        assert run.status == "done"
        assert run.steps_done == 5
        assert [seq for _, seq, _, _ in executions(log)] == [4, 5]

    def test_a_renamed_step_fails_the_run_as_nondeterministic(self, tenant, tmp_path):
        run = submit_run(tenant=tenant, kind="steps", input={"steps": 3})
        [claimed] = claim()
        checkpoint.checkpoint(
            checkpoint.Checkpoint.of(
                step_record(claimed, 1, "old_name"), output=1, steps_total=None
            ),
            worker_id=WORKER_ID,
            lease=60,
        )
        leave(Exit.release(reason="test").of_run(run.id, claimed.lease_token))
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind) == ("failed", "nondeterministic")
        assert "old_name" in run.error and "step1" in run.error

    def test_retryable_error_requeues_and_completed_steps_replay(self, tenant, settings):
        settings.RUNS_BACKOFF_BASE_SECONDS = 0.01
        settings.RUNS_BACKOFF_CAP_SECONDS = 0.02
        run = submit_run(tenant=tenant, kind="flaky", input={"fail_times": 1})

        # --burst leaves once nothing is claimable, so a run waiting out its
        # backoff needs another pass.
        def left_the_queue():
            burst_worker()
            return fresh(run).status != "queued"

        wait_until(left_the_queue, timeout=10, interval=0.02, what="the run to leave the queue")
        run = fresh(run)
        assert (run.status, run.attempt, run.failures, run.result) == ("done", 2, 0, {"call": "ok"})
        steps = {s.name: s for s in Step.objects.filter(run=run)}
        assert steps["first"].executions == 1
        assert steps["call"].executions == 2
        assert "503" in steps["call"].attempts.get().error

    def test_fatal_error_fails_at_once_with_a_readable_reason(self, tenant):
        run = submit_run(tenant=tenant, kind="broken", input={})
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1)
        assert "field 'email' is invalid" in run.error
        assert Step.objects.get(run=run).status == "failed"
        assert Tenant.objects.get(pk=tenant.pk).running == 0


@pytest.mark.django_db(transaction=True)
def test_heartbeat_and_checkpoint_are_hot_updates(tenant):
    """No indexed column is written by a heartbeat or a checkpoint (pg_stat_user_tables)."""
    submit_run(tenant=tenant, kind="noop3", input={})
    [claimed] = claim()

    def counters():
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_force_next_flush()")
            cursor.execute("SELECT pg_stat_clear_snapshot()")
            cursor.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs_run'"
            )
            return cursor.fetchone()

    register()
    before = counters()
    for seq in range(1, 21):
        assert claims.heartbeat(
            worker_id=WORKER_ID, held={claimed.lease_token: claimed.id}, lease=60
        ) == {claimed.lease_token: (False, False)}
        assert checkpoint.checkpoint(
            checkpoint.Checkpoint.of(
                step_record(claimed, seq, f"s{seq}"), output=None, steps_total=20
            ),
            worker_id=WORKER_ID,
            lease=60,
        )
    # Statistics reach the shared counters asynchronously: read until all 40 arrived.
    after = wait_until(
        lambda: (c := counters())[0] - before[0] >= 20 and c,
        timeout=10,
        what="the statistics flush",
    )
    updates, hot = after[0] - before[0], after[1] - before[1]
    assert updates == 20  # the checkpoints': a heartbeat writes the worker's row, no run's
    # Writing an indexed column makes every such update non-HOT (hot would be
    # 0 here). An update can also miss HOT when its page is full and cannot be
    # pruned yet, which a busy server (another session's old snapshot) causes
    # now and then: allow two of those.
    assert hot >= updates - 2, f"only {hot} of {updates} checkpoint updates were HOT"


@pytest.mark.django_db(transaction=True)
def test_a_run_waiting_on_a_step_after_a_checkpoint_holds_no_connection(tenant, monkeypatch):
    # Announcing late keeps the announcement from handing the connection
    # back: only the wait for a step that is not done at once may.
    monkeypatch.setattr("workers.step_thread.ANNOUNCE_AFTER_SECONDS", 5.0)
    run = submit_run(tenant=tenant, kind="fast_then_slow", input={"within": 1.0})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.result) == ("done", {"released": True})


@pytest.mark.django_db
class TestWorkerLease:
    """A heartbeat renews the worker's lease, one row whatever it holds; the reaper judges runs by it."""

    def test_a_heartbeat_writes_no_run_row_and_reports_only_flagged_runs(self, tenant):
        register()
        for _ in range(30):
            submit_run(tenant=tenant, kind="noop3", input={})
        claimed = claim(n=30)
        assert len(claimed) == 30
        held = {c.lease_token: c.id for c in claimed}

        def versions():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id, xmin::text FROM runs_run WHERE id = ANY(%s)", [list(held.values())]
                )
                return dict(cursor.fetchall())

        before, lease_before = versions(), WorkerRow.objects.get(pk=WORKER_ID).lease_until
        assert claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60) == {
            token: (False, False) for token in held
        }
        assert versions() == before  # no run row rewritten, none left dead
        assert WorkerRow.objects.get(pk=WORKER_ID).lease_until > lease_before

        Run.objects.filter(pk=claimed[3].id).update(cancel_requested_at=timezone.now())
        Run.objects.filter(pk=claimed[7].id).update(pause_requested_at=timezone.now())
        alive = claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60)
        assert alive[claimed[3].lease_token] == (True, False)
        assert alive[claimed[7].lease_token] == (False, True)
        assert len(alive) == 30 and sum(c or p for c, p in alive.values()) == 2

    def test_a_long_step_keeps_its_run_while_its_worker_beats(self, tenant):
        register()
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()
        # The step has run longer than the run's own lease; its worker is alive.
        Run.objects.filter(pk=run.id).update(locked_until=timezone.now() - timedelta(seconds=5))
        reaper = Reaper()
        assert reaper.find_expired() == []
        assert reaper.reap_once().rescued == 0
        assert not Run.objects.stale().exists()
        assert fresh(run).lease_token == claimed.lease_token
        # Its worker stops beating: once the worker's lease is over, the run is rescued.
        WorkerRow.objects.filter(pk=WORKER_ID).update(
            lease_until=timezone.now() - timedelta(seconds=1)
        )
        assert list(Run.objects.stale().values_list("pk", flat=True)) == [run.id]
        assert reaper.reap_once().rescued == 1
        assert fresh(run).status == "queued"

    def test_a_worker_whose_lease_lapsed_learns_which_runs_it_lost(self, tenant):
        register()
        a = submit_run(tenant=tenant, kind="noop3", input={})
        b = submit_run(tenant=tenant, kind="noop3", input={})
        claimed = {c.id: c for c in claim(n=2)}
        held = {c.lease_token: run_id for run_id, c in claimed.items()}
        expire_lease(a.id)
        Run.objects.filter(pk=b.id).update(locked_until=timezone.now() - timedelta(seconds=1))
        reaper = Reaper()
        stale = {s.run_id: s for s in reaper.find_expired()}
        assert set(stale) == {a.id, b.id}
        # The reaper took one before the worker came back.
        assert reaper.rescue(stale[a.id]) == "queued"
        alive = claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60)
        assert alive == {claimed[b.id].lease_token: (False, False)}
        assert reaper.rescue(stale[b.id]) is None  # the renewed lease keeps the other
        assert fresh(b).status == "running"

    def test_a_worker_with_no_row_keeps_nothing_by_its_heartbeat(self, tenant):
        run = submit_run(tenant=tenant, kind="noop3", input={})
        [claimed] = claim()  # WORKER_ID never registered
        held = {claimed.lease_token: run.id}
        assert claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60) == {
            claimed.lease_token: (False, False)
        }
        expire_lease(run.id)
        assert Reaper().reap_once().rescued == 1
        assert claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60) == {}
