"""ctx.step's options (README, "Writing an agent kind"): apart from fn's arguments, checked before anything runs or is written.

Every run here is executed by a real ``manage.py runworker --burst``
process; the step functions note each call in a file (tests/support/agents_step_options.py).
"""

from __future__ import annotations

import pytest
from django.db import connection

from runs.models import Run, Step, StepAttempt
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import notes
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def burst(processes, *runs: Run, rounds: int = 1) -> list[Run]:
    """A real worker process, until nothing is claimable; again while a run waits out its backoff."""
    left = [rounds]

    def finished() -> bool:
        done = processes.run(
            "runworker", "--burst", "--heartbeat", "1", "--lease", "10", timeout=90
        )
        assert done.returncode == 0, done.stdout + done.stderr
        left[0] -= 1
        return left[0] <= 0 and all(fresh(run).status not in ("queued", "running") for run in runs)

    # Between workers, a backoff of at most 0.1 s passes.
    wait_until(finished, timeout=120, interval=0.15, what="no run to be queued or running")
    return [fresh(run) for run in runs]


def test_fn_gets_its_keyword_arguments_from_kwargs_and_the_step_keeps_its_timeout(
    tenant, tmp_path, processes
):
    log = str(tmp_path / "calls.log")
    run = submit_run(tenant=tenant, kind="step_kwargs", input={"log": log})
    [run] = burst(processes, run)
    # fetch(url, timeout=7): its own timeout, not the step's (5 s) nor None.
    assert [(n["url"], n["timeout"]) for n in notes(log, called="fetch")] == [
        ("https://example.invalid/a", 7)
    ]
    fetched = Step.objects.get(run=run, name="fetch")
    assert fetched.status == "done"
    assert fetched.input == {"args": [log, "https://example.invalid/a"], "kwargs": {"timeout": 7}}
    # The second step's timeout (0.5 s) applied to it, not to slow's arguments.
    assert len(notes(log, called="slow")) == 1
    assert (run.status, run.error_kind) == ("failed", "retryable")
    assert "did not return within 0.5 s" in run.error


@pytest.mark.parametrize("side_effect", [False, True], ids=["plain", "side_effect"])
@pytest.mark.parametrize(
    ("case", "named"),
    [
        ("kind", "kind='LLM'"),
        ("unknown", "'retries'"),
        ("timeout", "timeout=0"),
    ],
)
def test_a_bad_option_fails_the_run_at_once_and_nothing_runs(
    tenant, tmp_path, processes, case, named, side_effect
):
    log = str(tmp_path / "calls.log")
    run = submit_run(
        tenant=tenant,
        kind="step_bad_option",
        input={"log": log, "case": case, "side_effect": side_effect},
    )
    [run] = burst(processes, run, rounds=2)  # a second worker finds nothing to retry
    assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1), run.error
    assert named in run.error
    assert len(notes(log, called="first")) == 1
    assert notes(log, called="act") == []  # the step function was never called
    # Nothing written for the refused step: no row ahead of a side effect, no attempt.
    assert list(Step.objects.filter(run=run).values_list("name", "status")) == [("first", "done")]
    assert not StepAttempt.objects.filter(step__run=run).exists()


@pytest.fixture
def refusing_checkpoints(transactional_db):
    """A trigger refusing, as a constraint would, to record a step named 'refused…' as done."""
    with connection.cursor() as cursor:
        cursor.execute("""
            CREATE FUNCTION test_refuse_step() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.status = 'done' AND NEW.name LIKE 'refused%' THEN
                    RAISE EXCEPTION 'step % refused by the test', NEW.name USING ERRCODE = 'check_violation';
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_refuse_step BEFORE INSERT OR UPDATE ON runs_step
                FOR EACH ROW EXECUTE FUNCTION test_refuse_step();
        """)
    yield
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER test_refuse_step ON runs_step; DROP FUNCTION test_refuse_step();"
        )


@pytest.mark.parametrize(
    ("case", "status", "error_kind", "step_status"),
    [
        ("plain", "failed", "fatal", "failed"),
        ("unkeyed", "waiting_human", "ambiguous", "waiting"),
    ],
)
def test_a_refused_checkpoint_never_runs_the_step_again(
    tenant, tmp_path, processes, refusing_checkpoints, case, status, error_kind, step_status
):
    log = str(tmp_path / "calls.log")
    run = submit_run(tenant=tenant, kind="step_refused", input={"log": log, "case": case})
    [run] = burst(processes, run, rounds=2)
    assert (run.status, run.error_kind, run.attempt) == (status, error_kind, 1), run.error
    assert "refused by the test" in run.error
    assert len(notes(log, called="refused")) == 1
    step = Step.objects.get(run=run, name="refused act")
    assert (step.status, step.output) == (step_status, None)
    assert "refused by the test" in step.error


def test_a_refused_checkpoint_of_a_keyed_side_effect_reruns_it_with_its_key(
    tenant, tmp_path, processes, refusing_checkpoints
):
    log = str(tmp_path / "calls.log")
    run = submit_run(tenant=tenant, kind="step_refused", input={"log": log, "case": "keyed"})
    [run] = burst(processes, run)
    calls = notes(log, called="refused")
    # Retried as a step failure within the retry budget (3), each time with the same key.
    assert (run.status, run.error_kind, run.attempt, len(calls)) == ("failed", "retryable", 3, 3), (
        run.error
    )
    assert {call["key"] for call in calls} == {f"{run.pk}:1:1"}
    assert "refused by the test" in run.error
