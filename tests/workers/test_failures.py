"""Error classes end to end (README.md, "When things go wrong"): retryable with backoff, fatal, ambiguous, step timeouts.

Against real PostgreSQL, with in-process workers (``Stepper`` executes one
attempt at a time so each attempt's run_after can be read) and, where a
process must die or be replaced, real ``runworker`` processes.
"""

from __future__ import annotations

import signal
from collections import Counter, defaultdict
from statistics import mean

import pytest
from django.utils import timezone

from runs.models import Event, Run, Step, StepAttempt, Tenant
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions, notes
from tests.support.failure_helpers import (
    Stepper,
    assert_left_alone,
    burst_worker,
    create_ledger,
    drive,
    exit_delay,
    ledger,
)
from tests.support.waiting import wait_until
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)

# The flaky_call kind's backoff: base 0.1 s, cap 0.8 s.
BASE, CAP = 0.1, 0.8


def claim_times(run: Run) -> dict[int, object]:
    """When each attempt of the run was claimed."""
    return {
        e.payload["attempt"]: e.created_at
        for e in Event.objects.filter(run=run, type="run.running")
    }


def attempt_until_done(runs, on_retry, *, timeout: float = 25) -> None:
    """Execute every due attempt of ``runs`` until all are done; ``on_retry(run)`` sees each retry's state."""
    stepper = Stepper()

    def all_done() -> bool:
        if not Run.objects.filter(pk__in=[r.pk for r in runs]).exclude(status="done").exists():
            return True
        for claimed in stepper.claim():
            if stepper.execute(claimed) == "queued":
                on_retry(Run.objects.get(pk=claimed.id))
        return False

    wait_until(all_done, timeout=timeout, interval=0.01, what="every run to be done")


class TestRetryable:
    def test_backoff_grows_exponentially_with_full_jitter_and_the_run_succeeds_later(
        self, tenant, tmp_path
    ):
        log = str(tmp_path / "calls.log")
        runs = [
            submit_run(tenant=tenant, kind="flaky_call", input={"log": log, "fail_times": 6})
            for _ in range(8)
        ]
        delays = defaultdict(list)  # failure number → delays before the next attempt, over all runs
        run_after = defaultdict(dict)  # run → failure number → run_after it set

        def on_retry(run):
            delays[run.failures].append(exit_delay(run))
            run_after[run.pk][run.failures] = run.run_after

        attempt_until_done(runs, on_retry)

        assert sorted(delays) == [1, 2, 3, 4, 5, 6]
        for n, values in delays.items():
            bound = min(CAP, BASE * 2 ** (n - 1))
            assert all(0 <= d <= bound + 1e-6 for d in values), (n, bound, values)
            assert len(set(values)) > 1, f"no jitter after failure {n}: {values}"
        # On average the waits grow (full jitter: uniform in [0, bound]).
        assert mean(delays[1] + delays[2]) < mean(delays[4] + delays[5] + delays[6])

        for run in runs:
            run = fresh(run)
            assert (run.status, run.attempt, run.failures, run.result) == (
                "done",
                7,
                0,
                {"called": "quote"},
            )
            # No attempt started before the run_after its predecessor set.
            claimed_at = claim_times(run)
            for n, after in run_after[run.pk].items():
                assert claimed_at[n + 1] >= after
            call = Step.objects.get(run=run, name="call")
            assert call.executions == 7
            attempts = list(StepAttempt.objects.filter(step=call).order_by("attempt"))
            assert [a.attempt for a in attempts] == [1, 2, 3, 4, 5, 6]
            assert {a.error_kind for a in attempts} == {"retryable"}
            assert all("upstream answered 503" in a.error for a in attempts)
            # The completed step before the failing one was replayed, not executed again.
            assert Counter(n["step"] for n in notes(log, run=str(run.pk))) == {
                "before": 1,
                "call": 7,
                "after": 1,
            }

    def test_backoff_starts_again_from_the_base_after_progress(self, tenant, tmp_path):
        """Step 1 fails three times, completes, then step 2 fails: a first failure again, and it waits like one."""
        log = str(tmp_path / "steps.log")
        runs = [
            submit_run(
                tenant=tenant,
                kind="bumpy_backoff",
                input={"log": log, "steps": 3, "failing": [1, 1, 1, 2]},
            )
            for _ in range(6)
        ]
        after_progress = []

        def on_retry(run):
            if run.steps_done:
                assert run.failures == 1
                after_progress.append(exit_delay(run))

        attempt_until_done(runs, on_retry)
        assert len(after_progress) == 6
        # bumpy_backoff: base 0.05 s, cap 2 s. The fourth consecutive failure would allow 0.4 s.
        assert all(d <= 0.05 + 1e-6 for d in after_progress), after_progress

    @pytest.mark.parametrize(
        ("error", "retry_after", "expected"),
        [
            ("retryable", 0.5, 0.5),  # Retryable(retry_after=0.5)
            ("retryable", 60, CAP),  # asked for more than the cap: the cap wins
            ("http429", None, 0.5),  # a 429 whose retry-after-ms header says 500
        ],
    )
    def test_retry_after_is_honoured_up_to_the_cap(
        self, tenant, tmp_path, error, retry_after, expected
    ):
        log = str(tmp_path / "calls.log")
        run = submit_run(
            tenant=tenant,
            kind="flaky_call",
            input={"log": log, "fail_times": 1, "error": error, "retry_after": retry_after},
        )
        stepper = Stepper()
        assert stepper.attempt(run) == "queued"
        # Jitter alone stays below the base (0.1 s); the wait is what the callee asked for.
        assert exit_delay(run) == pytest.approx(expected, abs=2e-6)
        waited_until = fresh(run).run_after
        assert (fresh(run).failures, fresh(run).error_kind) == (1, "retryable")

        assert stepper.attempt(run) == "done"
        assert claim_times(run)[2] >= waited_until

    def test_the_retry_budget_is_spent_by_consecutive_failures(self, tenant, tmp_path):
        log = str(tmp_path / "calls.log")
        run = submit_run(
            tenant=tenant, kind="flaky_call", input={"log": log, "fail_times": 99}, max_attempts=3
        )
        [run] = drive([run])
        assert (run.status, run.error_kind, run.attempt, run.failures) == (
            "failed",
            "retryable",
            3,
            3,
        )
        assert "step 2 (call)" in run.error and "upstream answered 503" in run.error
        assert Event.objects.filter(run=run).latest("seq").type == "run.failed"
        call = Step.objects.get(run=run, name="call")
        assert (call.status, call.executions, call.attempts.count()) == ("failed", 3, 3)
        assert Counter(n["step"] for n in notes(log)) == {"before": 1, "call": 3}
        assert_left_alone(run)

    def test_failures_reset_when_a_step_completes(self, tenant, tmp_path):
        """max_attempts=2, yet three unrelated 429s separated by completed steps do not fail the run."""
        log = str(tmp_path / "steps.log")
        run = submit_run(tenant=tenant, kind="bumpy", input={"log": log})
        assert run.max_attempts == 2
        [run] = drive([run])
        assert (run.status, run.attempt, run.failures) == ("done", 4, 0)
        assert run.result == {"done": [1, 2, 3, 4, 5, 6, 7]}
        assert sorted(StepAttempt.objects.filter(run=run).values_list("step__seq", flat=True)) == [
            2,
            4,
            6,
        ]
        assert Counter(n["seq"] for n in notes(log)) == {1: 1, 2: 2, 3: 1, 4: 2, 5: 1, 6: 2, 7: 1}


class TestFatal:
    @pytest.mark.parametrize(
        ("error", "in_run_error", "traceback"),
        [
            ("fatal", "field 'email' is invalid", False),
            ("keyerror", "KeyError: 'customer_id'", True),
            ("unknown", "InventoryGlitch: inventory service returned a negative stock level", True),
        ],
    )
    def test_fails_at_once_on_the_first_attempt(
        self, tenant, tmp_path, error, in_run_error, traceback
    ):
        log = str(tmp_path / "calls.log")
        run = submit_run(
            tenant=tenant, kind="flaky_call", input={"log": log, "fail_times": 1, "error": error}
        )
        burst_worker()
        run = fresh(run)
        assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1)
        assert in_run_error in run.error
        call = Step.objects.get(run=run, name="call")
        assert call.status == "failed"
        assert call.attempts.get().error_kind == "fatal"
        if traceback:  # an exception nobody classified keeps its traceback for whoever investigates
            assert "Traceback (most recent call last)" in call.error and "in _raise" in call.error
        assert Counter(n["step"] for n in notes(log)) == {"before": 1, "call": 1}
        assert Tenant.objects.get(pk=tenant.pk).running == 0
        assert_left_alone(run)


class TestAmbiguous:
    def test_explicit_ambiguous_waits_for_a_person_holding_nothing(self, tenant, tmp_path):
        log = str(tmp_path / "send.log")
        run = submit_run(
            tenant=tenant,
            kind="slow_call",
            input={"log": log, "side_effect": True, "explicit_ambiguous": True},
        )
        assert Stepper().attempt(run) == "waiting_human"
        run = fresh(run)
        assert (run.status, run.error_kind, run.attempt, run.lease_token) == (
            "waiting_human",
            "ambiguous",
            1,
            None,
        )
        assert "closed the connection after accepting" in run.error
        assert run.expires_at > timezone.now()
        send = Step.objects.get(run=run, name="send")
        assert (send.status, send.input, send.executions) == ("waiting", {"args": ["hello"]}, 1)
        assert "Ambiguous: the payment provider closed the connection" in send.error
        assert send.attempts.get().error_kind == "ambiguous"
        assert Tenant.objects.get(pk=tenant.pk).running == 0  # it holds no slot

        assert_left_alone(run)
        assert len(notes(log, step="send")) == 1
        assert Tenant.objects.get(pk=tenant.pk).running == 0

    def test_an_unkeyed_side_effect_that_times_out_waits_for_a_person(self, tenant, tmp_path):
        log = str(tmp_path / "send.log")
        run = submit_run(
            tenant=tenant, kind="slow_call", input={"log": log, "side_effect": True, "timeout": 0.2}
        )
        assert Stepper().attempt(run) == "waiting_human"
        run = fresh(run)
        assert (run.status, run.error_kind) == ("waiting_human", "ambiguous")
        send = Step.objects.get(run=run, name="send")
        assert (send.status, send.idempotency_key) == ("waiting", "")
        assert (
            "did not return within 0.2 s" in send.error
        )  # the step's timeout, not the kind's 0.3 s
        assert_left_alone(run)
        assert len(notes(log, step="send")) == 1

    def test_a_keyed_side_effect_that_times_out_is_retried_with_the_same_key(
        self, tenant, tmp_path
    ):
        log = str(tmp_path / "send.log")
        run = submit_run(
            tenant=tenant,
            kind="slow_call",
            input={"log": log, "side_effect": True, "keyed": True, "timeout": 0.2},
        )
        stepper = Stepper()
        assert stepper.attempt(run) == "queued"
        run = fresh(run)
        assert (run.failures, run.error_kind) == (1, "retryable")
        key = f"{run.pk}:{run.generation}:2"
        assert Step.objects.get(run=run, name="send").idempotency_key == key

        assert stepper.attempt(run) == "done"
        run = fresh(run)
        assert run.result == {"sent": "hello", "key": key}
        assert [n["key"] for n in notes(log, step="send")] == [key, key]
        send = Step.objects.get(run=run, name="send")
        assert (send.status, send.executions, send.idempotency_key) == ("done", 2, key)


def test_a_read_only_step_that_times_out_is_retried(tenant, tmp_path):
    log = str(tmp_path / "send.log")
    run = submit_run(
        tenant=tenant, kind="slow_call", input={"log": log}
    )  # the kind's step_timeout, 0.3 s
    stepper = Stepper()
    assert stepper.attempt(run) == "queued"
    run = fresh(run)
    assert (run.status, run.failures, run.error_kind) == ("queued", 1, "retryable")
    assert "did not return within 0.3 s" in run.error
    attempt = StepAttempt.objects.get(run=run)
    assert (attempt.step.name, attempt.error_kind) == ("send", "retryable")

    assert stepper.attempt(run) == "done"
    steps = {s.name: s.executions for s in Step.objects.filter(run=run)}
    assert steps == {"prepare": 1, "send": 2, "confirm": 1}


class TestKilledInsideASideEffect:
    """SIGKILL while a side-effect step is inside its callee, after the effect happened."""

    def kill_inside_the_charge(self, tenant, processes, tmp_path, *, keyed: bool):
        create_ledger()
        log = str(tmp_path / "effects.log")
        block = tmp_path / "block"
        block.touch()
        run = submit_run(
            tenant=tenant,
            kind="effect",
            input={"log": log, "keyed": keyed, "block_file": str(block)},
        )
        first = processes.worker("--lease", "3", "--heartbeat", "1", "--poll", "0.1")
        wait_until(lambda: notes(log, step="charge"), what="the charge to begin")
        wait_until(lambda: ledger(run), timeout=5, what="the effect")
        assert Step.objects.get(run=run, name="charge").status == "running"  # written ahead

        first.send_signal(signal.SIGKILL)
        first.wait(10)
        block.unlink()
        wait_until(
            lambda: fresh(run).locked_until < timezone.now(),
            timeout=10,
            what="the lease to expire",
        )
        assert Reaper().reap_once().rescued == 1
        assert (fresh(run).status, fresh(run).failures) == ("queued", 1)

        second = processes.worker("--burst")
        assert second.wait(60) == 0, processes.output(second)
        return log, fresh(run), first.pid, second.pid

    def test_keyed_the_step_runs_again_with_the_same_key_and_the_effect_happens_once(
        self, tenant, processes, tmp_path
    ):
        log, run, first, second = self.kill_inside_the_charge(
            tenant, processes, tmp_path, keyed=True
        )
        assert (run.status, run.attempt, run.result) == ("done", 2, {"charged": 42})
        key = f"{run.pk}:1:2"
        assert [(n["key"], n["pid"]) for n in notes(log, step="charge")] == [
            (key, first),
            (key, second),
        ]
        assert ledger(run) == [(key, first)]
        charge = Step.objects.get(run=run, name="charge")
        assert (charge.status, charge.executions, charge.idempotency_key) == ("done", 2, key)
        assert [n["pid"] for n in notes(log, step="finish")] == [second]

    def test_unkeyed_the_run_waits_for_a_person_and_nobody_repeats_the_effect(
        self, tenant, processes, tmp_path
    ):
        log, run, first, _ = self.kill_inside_the_charge(tenant, processes, tmp_path, keyed=False)
        assert (run.status, run.error_kind, run.attempt) == ("waiting_human", "ambiguous", 2)
        assert "no idempotency key" in run.error
        charge = Step.objects.get(run=run, name="charge")
        assert (charge.status, charge.executions) == ("waiting", 1)
        assert [n["pid"] for n in notes(log, step="charge")] == [first]
        assert len(ledger(run)) == 1
        assert Tenant.objects.get(pk=tenant.pk).running == 0

        assert_left_alone(run)
        assert len(notes(log, step="charge")) == 1 and len(ledger(run)) == 1
        assert not notes(log, step="finish")


def test_a_step_thread_that_never_returns_makes_the_worker_release_its_runs_and_exit_3(
    tenant, processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    try:
        stuck = submit_run(
            tenant=tenant, kind="hang", input={"block_file": str(block)}, max_attempts=1
        )
        others = [
            submit_run(
                tenant=tenant, kind="steps", input={"steps": 50, "log": log, "step_seconds": 0.1}
            )
            for _ in range(2)
        ]
        worker = processes.worker(
            "--concurrency", "3", "--poll", "0.1", RUNS_STEP_GRACE_SECONDS="1"
        )
        assert worker.wait(20) == 3, processes.output(worker)
    finally:
        block.unlink(missing_ok=True)  # let the orphan thread go, had the process survived
    assert "never returned" in processes.output(worker)

    stuck = fresh(stuck)
    assert (stuck.status, stuck.error_kind) == ("failed", "retryable")  # its one attempt timed out
    assert "did not return within 0.5 s" in stuck.error
    for run in others:
        run = fresh(run)
        # Released between two steps, spending nothing.
        assert (run.status, run.failures, run.error_kind, run.lease_token) == (
            "queued",
            0,
            "",
            None,
        )
        assert 0 < run.steps_done < 50
    assert Tenant.objects.get(pk=tenant.pk).running == 0

    # Another worker finishes them without repeating any step.
    assert {run.status for run in drive(others)} == {"done"}
    assert set(Counter((run_id, seq) for run_id, seq, _, _ in executions(log)).values()) == {1}
