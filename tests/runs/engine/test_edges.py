"""The engine's promises held at its edges: races of claims and reaps, hostile text, lost connections,
rolling deploys, doubt raised between steps, and reads that stay bounded."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runs.control import resolve_run
from runs.events import Actor
from runs.models import Event, Message, Run, Step, StepAttempt, Tenant
from runs.models import Worker as WorkerRow
from runs.selectors import waiting_for
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import notes
from tests.support.agents_edges import HOSTILE
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.reaper import Reaper
from workers.worker import Worker, WorkerOptions

PERSON = Actor(type="user", id="7")
FFFD = "\ufffd"


def burst(**options) -> None:
    options = {
        "burst": True,
        "heartbeat": 1,
        "lease": 10,
        "listen": False,
        "concurrency": 4,
    } | options
    Worker(WorkerOptions(**options)).run()


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    """The largest number of intervals that overlap at one instant."""
    points = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda p: (p[0], p[1]),
    )
    live = peak = 0
    for _, delta in points:
        live += delta
        peak = max(peak, live)
    return peak


@pytest.mark.django_db(transaction=True)
def test_a_tenant_never_runs_more_than_max_running_with_two_workers_and_a_busy_reaper(
    processes, tmp_path
):
    """Item 1: a slot given back by an exit is never also given back by the reaper's reconciliation."""
    tenant = TenantFactory(max_running=1)
    log = str(tmp_path / "spans.log")
    runs = [
        submit_run(tenant=tenant, kind="occupy", input={"log": log, "seconds": 0.03})
        for _ in range(80)
    ]
    for _ in range(2):
        processes.worker("--concurrency", "4", "--poll", "0.05")
    processes.manage("reap", "--interval", "0.005")

    wait_until(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="done").count() == len(runs),
        timeout=60,
        what="all runs done",
    )
    spans = [(row["start"], row["end"]) for row in notes(log)]
    assert len(spans) == len(runs)
    assert max_overlap(spans) == 1
    # The last exits' slots come back with each worker's next claim (deferred returns), soon after.
    wait_until(
        lambda: Tenant.objects.get(pk=tenant.pk).running == 0,
        timeout=10,
        what="the tenant's running counter back at 0",
    )


@pytest.mark.django_db(transaction=True)
def test_text_a_database_refuses_is_stored_replaced_and_the_step_runs_once(tenant, tmp_path):
    """Item 2: NUL and lone surrogates in step output, step names and results are kept as U+FFFD."""
    log = str(tmp_path / "calls.log")
    run = submit_run(tenant=tenant, kind="hostile_text", input={"log": log})
    burst()

    run = fresh(run)
    assert run.status == "done", (run.status, run.error)
    assert (
        len(notes(log, step="model")) == 1
    )  # executed once: not retried because it could not be stored
    clean = HOSTILE.replace("\u0000", FFFD).replace("\ud800", FFFD)
    assert run.result == {"answer": clean, "echo": clean}
    step = Step.objects.get(run=run)
    assert step.name == f"ask {clean}"
    assert step.output == {"text": clean, clean: [clean], "n": None}
    assert step.text_replaced is True
    assert (step.executions, step.cost_cents, run.cost_cents) == (1, 7, 7)
    assert run.attempt == 1


@pytest.mark.django_db(transaction=True)
def test_an_error_message_a_text_column_refuses_is_kept_readable(tenant):
    run = submit_run(tenant=tenant, kind="hostile_error", input={})
    burst()

    run = fresh(run)
    assert (run.status, run.error_kind) == ("failed", "fatal")
    assert f"tool said before{FFFD}middle{FFFD}after" in run.error
    attempt = StepAttempt.objects.get(run=run)
    assert "\u0000" not in attempt.error and FFFD in attempt.error
    assert Step.objects.get(run=run).text_replaced is True


@pytest.mark.django_db(transaction=True)
def test_the_same_run_claimed_again_by_the_same_worker_keeps_its_heartbeat(tenant, tmp_path):
    """Item 5: the old thread of a released run must not drop the new claim out of the heartbeat."""
    block = tmp_path / "block"
    block.touch()
    run = submit_run(
        tenant=tenant, kind="reclaimed", input={"block_file": str(block), "seconds": 4}
    )
    worker = Worker(WorkerOptions(concurrency=2, heartbeat=0.5, lease=1.5, poll=0.05, listen=False))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: fresh(run).status == "running", what="the first claim")
        first_token = fresh(run).lease_token

        # The lease is taken from the worker while its step blocks (as if it
        # had missed heartbeats); the same worker claims the run again.
        # Its lease and its worker's: a heartbeat landing in between renews the worker's, so
        # both are taken again until a pass of the reaper catches them expired.
        def taken() -> bool:
            past = timezone.now() - timezone.timedelta(seconds=1)
            Run.objects.filter(pk=run.pk).update(locked_until=past)
            WorkerRow.objects.filter(pk=worker.id).update(lease_until=past)
            return Reaper().reap_once().rescued == 1

        wait_until(taken, timeout=10, interval=0.01, what="the reaper to rescue the run")
        wait_until(
            lambda: fresh(run).status == "running" and fresh(run).lease_token != first_token,
            what="the second claim, by the same worker",
        )
        block.unlink()  # both executions go on; the old one finds its lease gone and ends
        wait_until(
            lambda: fresh(run).current_step == "long", what="the long step of the second claim"
        )
        # Several leases later, the second claim must still be alive: these 3 s of leases kept by
        # heartbeats are the behaviour under test, not a wait for something to happen.
        time.sleep(3)
        assert Reaper().reap_once().rescued == 0
        wait_until(lambda: fresh(run).status == "done", timeout=20, what="the run to finish")
    finally:
        worker.stop()
        thread.join(20)
    assert fresh(run).attempt == 2
    assert Event.objects.filter(run=run, payload__reason="lease_expired").count() == 1


@pytest.mark.django_db(transaction=True)
def test_ambiguous_between_steps_can_be_resolved_by_a_person(tenant):
    """Item 6: no step waits, yet a person can mark the run done, retry it or fail it."""
    done = submit_run(tenant=tenant, kind="doubt_between_steps", input={})
    failed = submit_run(tenant=tenant, kind="doubt_between_steps", input={})
    burst()

    run = fresh(done)
    assert (run.status, run.error_kind) == ("waiting_human", "ambiguous")
    shown = waiting_for(run)
    assert shown["type"] == "ambiguous" and shown["step"] is None and "maybe" in shown["error"]
    assert shown["actions"] == ["done", "retry", "fail"]

    resolve_run(run=run, actor=PERSON, action="done", output={"transfer": "went through"})
    run = fresh(done)
    assert (run.status, run.result, run.error_kind) == ("done", {"transfer": "went through"}, "")
    assert Event.objects.filter(run=run).latest("seq").type == "run.done"

    resolve_run(run=fresh(failed), actor=PERSON, action="fail")
    assert (fresh(failed).status, fresh(failed).error_kind) == ("failed", "ambiguous")


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_version_no_worker_can_resume_is_not_claimed(tenant):
    """Item 7: it waits for a worker that has its version, instead of bouncing between workers."""
    run = submit_run(tenant=tenant, kind="noop3", input={})
    Run.objects.filter(pk=run.pk).update(kind_version=7)
    started = time.monotonic()
    burst(poll=0.05)
    burst(poll=0.05)

    run = fresh(run)
    assert time.monotonic() - started < 10
    assert (run.status, run.attempt) == ("queued", 0)
    assert list(Event.objects.filter(run=run).values_list("type", flat=True)) == ["run.queued"]
    assert Tenant.objects.get(pk=tenant.pk).running == 0


@pytest.mark.django_db(transaction=True)
def test_losing_the_database_connections_mid_step_does_not_fail_a_run_with_one_attempt(
    tenant, processes, tmp_path
):
    """Item 8: a failover breaks the checkpoint's connection; the run goes back, spending nothing."""
    log = str(tmp_path / "kills.log")
    run = submit_run(tenant=tenant, kind="failover", input={"log": log})
    worker = processes.worker("--poll", "0.1", "--heartbeat", "1", "--lease", "5")

    wait_until(lambda: fresh(run).status in ("done", "failed"), timeout=30, what="the run to end")
    run = fresh(run)
    assert notes(log, attempt=1) and notes(log, attempt=1)[0]["killed"] >= 1
    assert (run.status, run.max_attempts, run.attempt) == ("done", 1, 2), (
        run.error,
        processes.output(worker),
    )
    assert run.result == {"attempt": 2}
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0


@pytest.mark.django_db(transaction=True)
def test_a_step_reads_the_inbox_in_bounded_pages(tenant):
    """Item 11: a run with 150 unread messages hands its first messages step 100, the next one 50."""
    run = submit_run(tenant=tenant, kind="many_messages", input={})
    Message.objects.bulk_create(
        Message(run=run, author_type="user", author_id="1", text=f"m{i}") for i in range(150)
    )
    burst()

    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"first": 100, "second": 50}
    assert not Message.objects.filter(run=run, consumed_by_step__isnull=True).exists()


@pytest.mark.django_db(transaction=True)
def test_a_reaper_pass_does_not_count_every_queued_run(tenant):
    """Item 11: the queued counters are reconciled now and then, not on every pass."""
    for _ in range(30):
        submit_run(tenant=tenant, kind="noop3", input={})
    # The submits' counter updates land after commit, debounced: wait for them.
    wait_until(lambda: Tenant.objects.get(pk=tenant.pk).queued == 30, what="the queued counter")
    Tenant.objects.filter(pk=tenant.pk).update(queued=0)  # drifted
    reaper = Reaper()

    def queued_counts(captured) -> list[str]:
        # The bounded count of a tenant's queued runs (runs/sql/reaping.sql, fix_tenant).
        return [q["sql"] for q in captured.captured_queries if "max_queued + 1" in q["sql"]]

    with CaptureQueriesContext(connection) as first:
        assert reaper.reap_once().tenants_fixed == 1
    assert Tenant.objects.get(pk=tenant.pk).queued == 30
    assert queued_counts(first)

    with CaptureQueriesContext(connection) as second:
        reaper.reap_once()
    assert queued_counts(second) == []


@pytest.mark.django_db(transaction=True)
def test_people_s_transitions_use_the_database_clock_not_the_web_server_s(tenant):
    """Item 9: a web server whose clock runs two hours ahead must not delay the runs people re-queue."""
    import time_machine

    from runs.control import approve_run, pause_run, resume_run
    from runs.db import db_now

    approved = submit_run(tenant=tenant, kind="approve_then_act", input={})
    burst()
    assert fresh(approved).status == "waiting_human"
    paused = submit_run(tenant=tenant, kind="noop3", input={})

    with time_machine.travel(timezone.now() + timezone.timedelta(hours=2), tick=True):
        approve_run(run=fresh(approved), actor=PERSON)
        pause_run(run=fresh(paused), actor=PERSON)
        resume_run(run=fresh(paused), actor=PERSON)

    now = db_now()
    for run in (fresh(approved), fresh(paused)):
        assert run.status == "queued"
        assert run.run_after <= now, (run.run_after, now)
        assert run.updated_at <= now
    burst()
    assert (fresh(approved).status, fresh(paused).status) == ("done", "done")


def _rows_read(plan: dict) -> int:
    """Rows the plan's scans of runs_run read (returned or filtered away), over all loops."""
    total = 0
    if plan.get("Relation Name") == "runs_run":
        loops = plan.get("Actual Loops", 1)
        total += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * loops
    for child in plan.get("Plans", []):
        total += _rows_read(child)
    return total


@pytest.mark.django_db
def test_a_claim_does_not_read_the_queued_runs_of_a_paused_or_unregistered_kind(tenant):
    """Item 13: 3,000 queued runs ahead in claim order, of kinds this claim does not take, are not scanned."""
    from django.db import transaction

    from runs.engine import claim as claims
    from runs.models import KindState

    for kind in ("noop3", "echo"):
        Run.objects.bulk_create(
            Run(tenant=tenant, kind=kind, queue="default", priority=0, input={})
            for _ in range(1500)
        )
    KindState.objects.create(name="noop3", paused=True)  # echo: not registered by this claim
    wanted = submit_run(tenant=tenant, kind="steps", input={"steps": 1}, priority=9)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run")
    statements: list[tuple[str, dict]] = []

    def capture(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(capture):
            [claimed] = claims.claim(
                worker_id=tenant.pk,
                queues=["default"],
                kinds={"steps": 1, "noop3": 1},
                n=5,
                lease=60,
            )
        transaction.set_rollback(True)
    assert claimed.id == wanted.pk
    sql, params = statements[-1]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    plan = plan if isinstance(plan, list) else __import__("json").loads(plan)
    assert _rows_read(plan[0]["Plan"]) < 50


@pytest.mark.django_db(transaction=True)
def test_a_slot_the_reaper_already_counted_is_not_given_back_again_by_the_next_claim():
    """Item 1, step by step: exit keeping the slot, reconcile, then the claim that would give it back."""
    from runs.engine import claim as claims
    from runs.engine.exit import Exit, leave
    from runs.engine.reaping import reconcile_tenants

    tenant = TenantFactory(max_running=1)
    first, second, third = (submit_run(tenant=tenant, kind="noop3", input={}) for _ in range(3))
    worker = Worker(WorkerOptions(burst=True, listen=False)).id

    def claim(returned=()):
        return claims.claim(
            worker_id=worker,
            queues=["default"],
            kinds={"noop3": 1},
            n=5,
            lease=60,
            returned=returned,
        )

    def running() -> int:
        return Tenant.objects.get(pk=tenant.pk).running

    [a] = claim()
    gone = leave(Exit.done(result="{}").of_run(a.id, a.lease_token, give_slot=False))
    assert gone.status == "done" and running() == 1  # the slot is still counted, for the next claim
    assert reconcile_tenants(queued=False) == 1 and running() == 0  # the reaper counted the truth

    [b] = claim(returned=[(tenant.pk, gone.at)])  # the slot a's exit kept: already given back
    assert running() == 1
    assert claim() == []  # at its limit: the third run waits
    later = leave(Exit.done(result="{}").of_run(b.id, b.lease_token, give_slot=False))
    [c] = claim(returned=[(tenant.pk, later.at)])  # left after the reconciliation: this one counts
    assert running() == 1
    assert {a.id, b.id, c.id} == {first.pk, second.pk, third.pk}
