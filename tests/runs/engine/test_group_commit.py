"""Group commit: the checkpoints and exits of several runs in one statement, and the worker's committer."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from uuid import uuid4

import pytest
from django.db import DatabaseError
from django.utils import timezone

from runs.engine import claim as claims
from runs.engine import steps as checkpoint
from runs.engine.exit import Exit, leave_many
from runs.models import Event, Run, Step, Tenant
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.waiting import wait_until
from workers.committer import Committer

WORKER_ID = uuid4()


def claim_runs(tenant, n):
    for _ in range(n):
        submit_run(tenant=tenant, kind="noop3", input={})
    claimed = claims.claim(
        worker_id=WORKER_ID, queues=["default"], kinds={"noop3": 1}, n=n, lease=60
    )
    assert len(claimed) == n
    return claimed


def finished_step(claimed, *, seq=1, output=None, cost=Decimal(0), token=None):
    record = checkpoint.StepRecord(
        run_id=claimed.id,
        token=claimed.lease_token if token is None else token,
        generation=claimed.generation,
        seq=seq,
        name=f"s{seq}",
        kind="custom",
        input={"n": seq},
        started_at=datetime.now(UTC),
        cost_cents=cost,
    )
    return checkpoint.Checkpoint.of(
        record, output={"seq": seq} if output is None else output, steps_total=3
    )


@pytest.mark.django_db(transaction=True)
def test_checkpoint_many_writes_each_run_s_step_and_nothing_for_a_lost_lease(tenant):
    a, b, c = claim_runs(tenant, 3)
    answers = checkpoint.checkpoint_many(
        [
            finished_step(a, cost=Decimal("1.5")),
            finished_step(b, token=b.lease_token + 1000),
            finished_step(c, output={"text": "nul\x00 and a lone \ud800"}),
        ],
        worker_id=WORKER_ID,
        lease=60,
    )
    assert answers[1] is None  # b's lease is not that token's: nothing of b was written
    assert answers[0][:3] == (False, False, Decimal("1.5")) and answers[2][:3] == (
        False,
        False,
        Decimal(0),
    )
    assert answers[2][3] == '{"text":"nul\\ufffd and a lone \\ufffd"}'  # the output as stored
    for claimed, steps in ((a, 1), (b, 0), (c, 1)):
        run = fresh(Run.objects.get(pk=claimed.id))
        assert (run.steps_done, Step.objects.filter(run=run, status="done").count()) == (
            steps,
            steps,
        )
        assert Event.objects.filter(run=run, type="step.done").count() == steps
    run_a = Run.objects.get(pk=a.id)
    assert (run_a.steps_total, run_a.current_step, run_a.cost_cents) == (3, "s1", Decimal("1.5"))
    step_c = Step.objects.get(run_id=c.id)
    assert step_c.text_replaced and step_c.output == {"text": "nul\ufffd and a lone \ufffd"}
    assert Event.objects.get(run_id=a.id, type="step.done").payload["cost_cents"] == 1.5
    assert Tenant.objects.get(pk=tenant.pk).daily_costs.get().cost_cents == Decimal("1.5")


@pytest.mark.django_db(transaction=True)
def test_leave_many_ends_each_run_as_its_own_exit_says(tenant):
    a, b, c = claim_runs(tenant, 3)
    before = timezone.now()
    answers = leave_many(
        [
            Exit.done(result='{"ok":1}')
            .of_run(a.id, a.lease_token, give_slot=False)
            .reporting(outcome="succeeded", summary="did\nit"),
            Exit.retry(error="boom", delay=30, error_class="RuntimeError").of_run(
                b.id, b.lease_token, give_slot=False
            ),
            Exit.done(result="{}").of_run(c.id, c.lease_token + 1000),
        ]
    )
    assert [x.status if x else None for x in answers] == ["done", "queued", None]
    run_a, run_b, run_c = (Run.objects.get(pk=x.id) for x in (a, b, c))
    assert (run_a.result, run_a.outcome, run_a.summary, run_a.lease_token) == (
        {"ok": 1},
        "succeeded",
        "did it",
        None,
    )
    assert run_a.finished_at is not None
    assert (run_b.failures, run_b.error, run_b.error_kind) == (1, "boom", "retryable")
    assert run_b.run_after > before + timedelta(seconds=25)
    assert (
        run_c.status == "running" and run_c.lease_token == c.lease_token
    )  # its guard did not match
    assert (
        Event.objects.get(run=run_b, type="run.queued", seq=run_b.last_event_seq).payload["reason"]
        == "retry"
    )
    assert Event.objects.get(run=run_a, type="run.done").payload["result"] == {"ok": 1}
    # The retried run is counted back into the tenant's queue, once; no slot given back (give_slot=False).
    # (The submits' own counts are debounced, runs.notify: they may land a moment later.)
    wait_until(
        lambda: Tenant.objects.filter(pk=tenant.pk, running=3, queued=1).exists(),
        timeout=5,
        what="the tenant counters to read running=3, queued=1",
    )


@pytest.mark.django_db(transaction=True)
def test_the_committer_raises_a_failing_write_to_its_run_only(tenant):
    runs = claim_runs(tenant, 8)
    committer = Committer(worker_id=WORKER_ID, lease=60)
    committer.start()
    answers, start = {}, threading.Barrier(len(runs))

    def write(claimed, index):
        # Past the column's range (18 digits, 6 after the point): the database refuses that step.
        item = finished_step(claimed, cost=Decimal("10") ** 13 if index == 3 else Decimal(0))
        start.wait()
        try:
            answers[index] = committer.commit(item)
        except DatabaseError as exc:
            answers[index] = exc

    threads = [threading.Thread(target=write, args=(claimed, i)) for i, claimed in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    committer.stop()
    assert isinstance(answers[3], DatabaseError)
    assert all(
        answers[i] is not None and not isinstance(answers[i], Exception) for i in range(8) if i != 3
    )
    done = set(Step.objects.filter(status="done").values_list("run_id", flat=True))
    assert done == {claimed.id for i, claimed in enumerate(runs) if i != 3}
    assert Run.objects.get(pk=runs[3].id).steps_done == 0


@pytest.mark.django_db(transaction=True)
def test_engine_statements_are_planned_once_per_connection_without_jit(tenant):
    from runs.db import engine_cursor

    runs = claim_runs(tenant, 4)
    for claimed in runs:  # one checkpoint at a time, as a lone run's
        assert (
            checkpoint.checkpoint_many([finished_step(claimed)], worker_id=WORKER_ID, lease=60)[0]
            is not None
        )
    with engine_cursor() as cursor:
        cursor.execute("SHOW jit")
        assert cursor.fetchone() == {"jit": "off"}  # rows by column name
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%json_to_recordset%INSERT INTO runs_step%"],
        )
        plans = cursor.fetchall()
    # Prepared after RUNS_DB_PREPARE_THRESHOLD executions, then never planned again.
    assert plans and all(p["custom_plans"] == 0 and p["generic_plans"] >= 1 for p in plans), plans
