"""Concurrency keys (runs.engine.keys): at most one active run per key, whatever races with it.

Submits race from threads of the test process (each its own database
connection), through ``submit_run`` as an application calls it; the runs
are executed by real ``runworker`` processes and watched from outside.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction

from runs.control import post_message, retry_run
from runs.engine import keys
from runs.events import Actor
from runs.exceptions import InvalidTransition
from runs.models import Event, Run
from runs.services import submit_run
from tests.support.agents import executions, notes
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.reaper import Reaper

processes_db = pytest.mark.django_db(transaction=True)
PERSON = Actor(type="user", id="1")


def race(n: int, submit: Callable[[int], Any]) -> list[Any]:
    """``submit(i)`` from ``n`` threads released at once; each result, or the exception it raised."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def go(i: int) -> None:
        barrier.wait()
        try:
            results[i] = submit(i)
        except Exception as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def active_of(key: str) -> int:
    return Run.objects.filter(concurrency_key=key, status="running").count()


@processes_db
def test_enqueue_runs_a_keys_runs_one_at_a_time_in_submission_order(processes, tmp_path):
    log = str(tmp_path / "exec.log")
    tenant = TenantFactory(max_running=20)
    work = {"steps": 2, "step_seconds": 0.1, "log": log}
    submitted = race(
        6, lambda i: submit_run(tenant=tenant, kind="steps", input=work, concurrency_key="lead:7")
    )
    others = [submit_run(tenant=tenant, kind="steps", input=work, concurrency_key="lead:8")]
    assert all(isinstance(run, Run) for run in submitted), submitted
    statuses = sorted(Run.objects.filter(concurrency_key="lead:7").values_list("status", flat=True))
    assert statuses == ["queued"] + ["waiting"] * 5  # one holds the key, the others wait their turn

    workers = [processes.worker("--concurrency", "4", "--poll", "0.1") for _ in range(2)]
    peak = 0

    def sample() -> bool:
        nonlocal peak
        peak = max(peak, active_of("lead:7"))
        assert active_of("lead:7") <= 1
        return Run.objects.filter(status="done").count() == 7

    wait_until(sample, timeout=60, interval=0.02, what="every run of both keys done")
    processes.stop_all()
    assert all(w.poll() is not None for w in workers)

    assert peak == 1
    runs = list(Run.objects.filter(concurrency_key="lead:7").order_by("created_at", "id"))
    # In submission order, each started after the one before it had finished.
    for before, after in zip(runs, runs[1:], strict=False):
        assert after.started_at >= before.finished_at, (before.pk, after.pk)
    # Executions never overlapped: each run's steps are together in the log.
    order = [run_id for run_id, *_ in executions(log) if run_id in {str(r.pk) for r in runs}]
    assert order == [str(r.pk) for r in runs for _ in range(2)]
    # Another key was never held behind this one.
    assert Run.objects.get(pk=others[0].pk).started_at < runs[-1].started_at
    held = Event.objects.filter(run=runs[-1], type="run.waiting").get()
    assert held.payload["reason"] == "concurrency_key"
    assert Event.objects.filter(run=runs[-1], type="run.queued").get().payload["reason"] == (
        "concurrency_key"
    )


@processes_db
def test_reject_lets_exactly_one_of_two_racing_submits_through(processes, tmp_path):
    tenant = TenantFactory(max_running=20)

    def submit(i: int) -> Run:
        return submit_run(
            tenant=tenant,
            kind="steps",
            input={"steps": 1, "step_seconds": 0.3},
            concurrency_key="doc:1",
            on_conflict="reject",
        )

    for _ in range(3):  # three rounds of the race, a fresh key holder each time
        results = race(2, submit)
        won = [r for r in results if isinstance(r, Run)]
        lost = [r for r in results if isinstance(r, keys.ConcurrencyKeyTaken)]
        assert len(won) == 1 and len(lost) == 1, results
        assert lost[0].run_id == won[0].pk  # the refusal names the live run
        assert str(won[0].pk) in str(lost[0])
        # A queued run holds its key as a running one does: a third submit is refused too.
        with pytest.raises(keys.ConcurrencyKeyTaken):
            submit(2)
        Run.objects.filter(pk=won[0].pk).update(status="cancelled")
    assert Run.objects.filter(concurrency_key="doc:1").count() == 3

    # Once the live run has ended, the key is free again.
    worker = processes.worker("--concurrency", "2", "--poll", "0.1")
    run = submit(0)
    wait_until(lambda: Run.objects.get(pk=run.pk).status == "done", what="the run done")
    assert isinstance(submit(0), Run)
    processes.stop_all()
    assert worker.poll() is not None


@processes_db
@pytest.mark.parametrize("rollback", [False, True])
def test_cancel_running_stops_the_live_run_and_the_last_racing_submit_runs(
    processes, tmp_path, rollback
):
    log = str(tmp_path / "log")
    gate = tmp_path / "gate"
    gate.touch()
    tenant = TenantFactory(max_running=20)
    policy = "cancel_running_with_rollback" if rollback else "cancel_running"
    holder = submit_run(
        tenant=tenant,
        kind="wf_saga",
        input={"steps": 2, "wait_after": 1, "gate": str(gate), "log": log},
        concurrency_key="crm:42",
    )
    processes.worker("--concurrency", "4", "--poll", "0.1")
    wait_until(lambda: notes(log, run=str(holder.pk), action="do", step=1), what="step 1 done")

    results = race(
        2,
        lambda i: submit_run(
            tenant=tenant,
            kind="wf_saga",
            input={"steps": 1, "log": log, "i": i},
            concurrency_key="crm:42",
            on_conflict=policy,
        ),
    )
    assert all(isinstance(r, Run) for r in results), results
    wait_until(
        lambda: (
            Run.objects.filter(concurrency_key="crm:42", status__in=["done", "cancelled"]).count()
            == 3
        ),
        timeout=60,
        what="the holder cancelled and the racing submits settled",
    )
    processes.stop_all()

    holder = Run.objects.get(pk=holder.pk)
    assert holder.status == "cancelled"
    assert not notes(log, run=str(holder.pk), action="do", step=2)  # stopped at a step boundary
    undone = notes(log, run=str(holder.pk), action="undo")
    assert [n["step"] for n in undone] == ([1] if rollback else [])
    assert holder.compensation == ("done" if rollback else "")
    # The second of the racing submits to take the key cancelled the first while it was held
    # (it never started); the second ran, once the holder had ended.
    raced = {r.status: r for r in Run.objects.filter(pk__in=[r.pk for r in results])}
    assert set(raced) == {"cancelled", "done"}
    assert raced["cancelled"].started_at is None
    assert raced["done"].started_at >= holder.finished_at


@pytest.mark.django_db(transaction=True)
def test_the_database_refuses_a_second_active_run_of_a_key(tenant):
    first = submit_run(tenant=tenant, kind="steps", input={}, concurrency_key="k")
    second = submit_run(tenant=tenant, kind="steps", input={}, concurrency_key="k")
    assert Run.objects.get(pk=second.pk).status == "waiting"
    # Whatever code tried to start it beside the first, the unique index says no.
    with pytest.raises(IntegrityError), transaction.atomic():
        Run.objects.filter(pk=second.pk).update(status="queued")
    assert Run.objects.get(pk=first.pk).status == "queued"


@pytest.mark.django_db(transaction=True)
def test_a_held_run_is_not_started_by_a_message_and_a_retry_waits_for_the_key(tenant):
    first = submit_run(tenant=tenant, kind="steps", input={}, concurrency_key="k")
    held = submit_run(tenant=tenant, kind="steps", input={}, concurrency_key="k")
    post_message(run=Run.objects.get(pk=held.pk), actor=PERSON, text="go on")
    assert Run.objects.get(pk=held.pk).status == "waiting"  # recorded; its turn has not come

    from runs.control import cancel_run

    cancel_run(run=Run.objects.get(pk=held.pk), actor=PERSON)
    with pytest.raises(InvalidTransition, match="same concurrency key"):
        retry_run(run=Run.objects.get(pk=held.pk), actor=PERSON)
    cancel_run(run=Run.objects.get(pk=first.pk), actor=PERSON)
    retried = retry_run(run=Run.objects.get(pk=held.pk), actor=PERSON).run
    assert retried.status == "queued"


@pytest.mark.django_db(transaction=True)
def test_the_reaper_releases_a_key_whose_release_was_lost(tenant):
    first = submit_run(tenant=tenant, kind="steps", input={}, concurrency_key="k")
    held = submit_run(tenant=tenant, kind="steps", input={}, concurrency_key="k")
    # The holder ended, and its process died before the release that follows the commit.
    Run.objects.filter(pk=first.pk).update(status="failed")
    assert Run.objects.get(pk=held.pk).status == "waiting"

    report = Reaper().reap_once()
    assert report.released == 1
    assert Run.objects.get(pk=held.pk).status == "queued"
    assert Reaper().reap_once().released == 0


@pytest.mark.django_db
def test_the_api_takes_a_key_and_names_the_live_run_in_a_409(api):
    def post(body: dict):
        return api.post("/api/runs", json.dumps(body), content_type="application/json")

    body = {"kind": "steps", "input": {"steps": 1}, "concurrency_key": "lead:1"}
    first = post(body)
    assert first.status_code == 202 and first.json()["concurrency_key"] == "lead:1"
    second = post(body)  # enqueue, the default
    assert second.status_code == 202
    assert second.json()["status"] == "waiting"
    assert second.json()["waiting_for"] == {"type": "concurrency_key", "key": "lead:1"}
    refused = post(body | {"on_conflict": "reject"})
    assert refused.status_code == 409
    assert refused.json()["run_id"] == first.json()["id"]
    for bad in ({"on_conflict": "queue"}, {"concurrency_key": ""}, {"concurrency_key": "k" * 256}):
        answer = post(body | bad)
        assert answer.status_code == 422, answer.content
        assert answer.json()["detail"]
    assert Run.objects.count() == 2


@processes_db
def test_a_retried_submit_with_cancel_running_gets_its_run_and_cancels_nothing(tenant):
    """The same request twice (a client's retry, say), both past the idempotency lookup before
    either committed: the second must return the first's run, not cancel it as the key's holder."""
    key_held = threading.Event()
    let_go = threading.Event()

    def hold_the_key() -> None:
        try:
            with transaction.atomic():
                keys.lock(tenant.pk, "crm:7")
                key_held.set()
                let_go.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_key)
    holder.start()
    assert key_held.wait(10)

    results: list[Any] = []

    def submit(i: int) -> Run:
        return submit_run(
            tenant=tenant,
            kind="steps",
            input={"steps": 1},
            concurrency_key="crm:7",
            on_conflict="cancel_running",
            idempotency_key="retry-me",
        )

    racing = threading.Thread(target=lambda: results.extend(race(2, submit)))
    racing.start()

    def waiting_for_the_key() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            return cursor.fetchone()[0]

    wait_until(lambda: waiting_for_the_key() == 2, what="both submits waiting for the key")
    let_go.set()
    holder.join(10)
    racing.join(30)

    assert all(isinstance(r, Run) for r in results), results
    assert results[0].pk == results[1].pk
    runs = list(Run.objects.filter(concurrency_key="crm:7"))
    assert [(r.pk, r.status) for r in runs] == [(results[0].pk, "queued")]
    assert not Event.objects.filter(run_id=results[0].pk, type="run.cancelled").exists()
