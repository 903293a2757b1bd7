"""Human control with real worker processes: cancel and pause a long step, approvals that free their
worker, messages that wake a run, messages a killed worker had read, and a message that arrives
while the worker parks the run.

API-level rules (every state, 409s, races between people) are in test_control_api.py, operator
retries in test_control_retry.py, scopes and tenants in test_control_scopes.py.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from runs import control
from runs.models import TERMINAL_STATUSES, Message, Run, Step, Tenant, Worker
from runs.services import Actor, submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.control_helpers import (
    OpenTransaction,
    RowLock,
    act,
    assert_events_consistent,
    backends_waiting_on_locks,
    event_types,
    get,
    steps_of,
    terminate_backends,
)
from tests.support.waiting import wait_until
from workers.reaper import Reaper

pytestmark = pytest.mark.django_db(transaction=True)


def heartbeat_since_now(run: Run) -> None:
    """Wait until the run's worker has beaten after this moment (the database's).

    The heartbeat stamps the worker's row in the statement that reads the cancel and pause flags of
    the runs it holds: one stamped after a request committed has told the worker of it.
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        [now] = cursor.fetchone()
    worker = fresh(run).locked_by
    assert worker is not None, "the run is not held by a worker"
    wait_until(
        lambda: Worker.objects.get(pk=worker).last_seen_at > now,
        timeout=45,  # the 'control' NOTIFY wakes the heartbeat at once; without it, within 30 s
        what="a heartbeat of the run's worker after the request",
    )


def started(processes, *args, **env):
    """A runworker process, once it has registered (so a NOTIFY reaches it)."""
    proc = processes.worker(*args, **env)
    wait_until(
        lambda: Worker.objects.filter(pid=proc.pid, stopped_at__isnull=True).exists(),
        timeout=30,
        what="the worker to register",
    )
    return proc


def stop(processes, proc) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, processes.output(proc)
    output = processes.output(proc)
    assert "Traceback" not in output and " ERROR " not in output, output


def kill(proc) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def rescue(run: Run) -> None:
    """What the reaper does for a run whose worker died: back to the queue once its lease expired."""
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=15, what="the lease to expire"
    )
    assert Reaper().reap_once().rescued == 1
    assert fresh(run).status == "queued"


# The start of workers.checkpoint's statement (pg_stat_activity keeps only the first 1 kB of a query).
CHECKPOINT = (
    "<> 'compensation')::int"  # the checkpoint's steps_done = steps_done + (kind <> 'compensation')
)


def in_step(log, run, name: str) -> bool:
    return steps_of(log, run)[name] > 0


def tenant_running(tenant) -> int:
    return Tenant.objects.get(pk=tenant.pk).running


# --- cancel ---------------------------------------------------------------------------


def test_cancel_of_a_running_run_stops_its_long_step_and_frees_the_tenant_slot(
    tenant, api_person, processes, tmp_path
):
    Tenant.objects.filter(pk=tenant.pk).update(max_running=1)
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    # Heartbeats every 30 s: only the 'control' NOTIFY can tell the worker soon.
    worker = started(processes, "--concurrency", "2", "--poll", "0.2", "--heartbeat", "30")
    run = submit_run(
        tenant=tenant, kind="long_steps", input={"steps": 3, "log": log, "hold_file": str(hold)}
    )
    wait_until(
        lambda: in_step(log, run, "step1") and fresh(run).current_step == "step1",
        what="step1 to run",
    )
    waiting = submit_run(tenant=tenant, kind="echo", input={"text": "next"})
    # A second of polls (every 0.2 s) that must not claim it: the behaviour under test, not a wait.
    time.sleep(1)
    assert fresh(waiting).status == "queued"  # the tenant's one slot is taken

    response = act(api_person.client, run, "cancel")

    assert response.status_code == 202, response.content
    assert (response.json()["status"], response.json()["cancel_requested"]) == ("running", True)
    wait_until(lambda: fresh(run).status == "cancelled", timeout=15, what="the run to be cancelled")
    assert hold.exists()  # the step was not let go: it saw ctx.cancelled and stopped early
    assert Step.objects.get(run=run, seq=1).output == {"seq": 1, "stopped_early": True}
    assert steps_of(log, run) == {"step1": 1}
    run = fresh(run)
    assert (run.lease_token, run.locked_by, run.locked_until, run.result) == (
        None,
        None,
        None,
        None,
    )
    api_person.did(run, "run.cancel_requested")
    assert run.events.get(type="run.cancelled").actor_type == "worker"
    assert_events_consistent(run)
    # Its slot went back: the other run gets it.
    wait_until(lambda: fresh(waiting).status == "done", timeout=15, what="the other run to finish")
    wait_until(lambda: tenant_running(tenant) == 0, timeout=5, what="the slot to be free")

    # Retried, it continues from its step log.
    hold.unlink()
    assert act(api_person.client, run, "retry").status_code == 200
    wait_until(lambda: fresh(run).status == "done", timeout=15, what="the retried run to finish")
    assert steps_of(log, run) == {"step1": 1, "step2": 1, "step3": 1}
    assert [o["stopped_early"] for o in fresh(run).result["outputs"]] == [True, False, False]
    stop(processes, worker)


def test_cancels_racing_runs_to_their_end_leave_each_in_exactly_one_terminal_state(
    tenant, api_person, processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    worker = started(
        processes, "--concurrency", "4", "--poll", "0.2", "--heartbeat", "1", "--lease", "5"
    )
    with transaction.atomic():  # all queued at once; each takes ~0.4 s, 4 at a time
        runs = [
            submit_run(
                tenant=tenant, kind="steps", input={"steps": 4, "log": log, "step_seconds": 0.1}
            )
            for _ in range(20)
        ]
    rng = random.Random(20)
    answers: dict = {}

    def cancel(run, delay):
        try:
            time.sleep(delay)  # cancels spread over the runs' lives: the race under test
            answers[run.id] = act(api_person.client, run, "cancel").status_code
        finally:
            connections.close_all()

    threads = [threading.Thread(target=cancel, args=(run, rng.uniform(0, 2.5))) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    wait_until(
        lambda: all(fresh(r).status in TERMINAL_STATUSES for r in runs),
        timeout=30,
        what="every run to end",
    )

    assert set(answers.values()) <= {200, 202, 409}, answers
    assert len(set(answers.values())) >= 2, answers  # the cancels met runs in more than one state
    for run in runs:
        run = fresh(run)
        assert run.status in ("done", "cancelled"), (run.status, run.error)
        answer = answers[run.id]
        if answer == 200:  # cancelled while it was not running
            assert run.status == "cancelled"
        if answer == 409:  # it had finished already
            assert run.status == "done"
        if run.status == "done":
            assert (run.steps_done, run.result) == (
                4,
                {"steps": 4, "last": {"seq": 4, "name": "step4"}},
            )
        else:
            assert run.steps_done < 4 and run.result is None
        assert Step.objects.filter(run=run, status="done").count() == run.steps_done
        assert run.lease_token is None and run.finished_at is not None
        assert_events_consistent(run)
    # No step ran twice, and every slot came back.
    assert set(Counter((r, seq) for r, seq, _, _ in executions(log)).values()) <= {1}
    assert Tenant.objects.filter(pk=tenant.pk).values_list("running", "queued").get() == (0, 0)
    assert worker.poll() is None
    stop(processes, worker)


# --- pause --------------------------------------------------------------------------


def test_pause_during_a_long_step_lets_it_finish_then_frees_the_worker(
    tenant, api_person, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    worker = started(processes, "--concurrency", "1", "--poll", "0.2", "--heartbeat", "30")
    run = submit_run(
        tenant=tenant, kind="long_steps", input={"steps": 3, "log": log, "hold_file": str(hold)}
    )
    wait_until(
        lambda: in_step(log, run, "step1") and fresh(run).current_step == "step1",
        what="step1 to run",
    )

    response = act(api_person.client, run, "pause")

    assert response.status_code == 202, response.content
    assert (response.json()["status"], response.json()["pause_requested"]) == ("running", True)
    heartbeat_since_now(run)  # the worker knows of the pause
    assert fresh(run).status == "running"  # a pause waits for the step boundary
    hold.unlink()
    wait_until(lambda: fresh(run).status == "paused", timeout=15, what="the run to pause")
    run = fresh(run)
    assert (run.steps_done, run.lease_token, run.locked_by) == (1, None, None)
    assert Step.objects.get(run=run, seq=1).output == {"seq": 1, "stopped_early": False}
    assert get(api_person.client, run)["waiting_for"] == {"type": "resume"}
    assert tenant_running(tenant) == 0
    # The worker (one slot) is free for other runs meanwhile.
    other = submit_run(tenant=tenant, kind="echo", input={"text": "meanwhile"})
    wait_until(lambda: fresh(other).status == "done", timeout=15, what="another run to finish")
    assert fresh(run).status == "paused"

    resumed = act(api_person.client, run, "resume")

    assert (resumed.status_code, resumed.json()["status"]) == (200, "queued")
    wait_until(lambda: fresh(run).status == "done", timeout=15, what="the resumed run to finish")
    assert steps_of(log, run) == {"step1": 1, "step2": 1, "step3": 1}
    api_person.did(run, "run.pause_requested")
    api_person.did(run, "run.resumed")
    assert fresh(run).events.get(type="run.paused").actor_type == "worker"
    assert_events_consistent(run)
    stop(processes, worker)


# --- approvals ------------------------------------------------------------------------


def worker_connections(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]


def test_a_run_waiting_for_approval_holds_no_worker_slot_lease_or_connection(
    tenant, api_person, processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    # One run at a time and one pooled connection: a waiting run holding either would block the next run.
    worker = started(
        processes,
        "--concurrency",
        "1",
        "--poll",
        "0.2",
        "--heartbeat",
        "1",
        RUNS_DB_POOL_MIN="1",
        RUNS_DB_POOL_MAX="1",
        RUNS_APPLICATION_NAME="ctl-approvals",
    )
    # Its one pooled connection and its LISTEN connection.
    wait_until(
        lambda: worker_connections("ctl-approvals") == 2,
        timeout=10,
        what="the worker's connections",
    )
    run = submit_run(tenant=tenant, kind="approve_then_act", input={"log": log})
    wait_until(
        lambda: fresh(run).status == "waiting_human",
        timeout=15,
        what="the run to wait for approval",
    )

    assert get(api_person.client, run)["waiting_for"] == {
        "type": "approval",
        "step": 2,
        "name": "update_crm",
        "proposal": {"fields": {"stage": "won"}},
    }
    run = fresh(run)
    assert (run.lease_token, run.locked_by, run.locked_until) == (None, None, None)
    assert tenant_running(tenant) == 0
    parked_at = timezone.now()
    wait_until(
        lambda: Worker.objects.filter(
            pid=worker.pid, last_seen_at__gt=parked_at, runs_held=0
        ).exists(),
        timeout=10,
        what="the worker to report that it holds no run",
    )
    other = submit_run(tenant=tenant, kind="echo", input={"text": "meanwhile"})
    wait_until(
        lambda: fresh(other).status == "done", timeout=15, what="another run to finish meanwhile"
    )
    assert fresh(run).status == "waiting_human"
    assert worker_connections("ctl-approvals") == 2

    response = act(api_person.client, run, "approve", {"comment": "ship it"})

    assert response.status_code == 200, response.content
    wait_until(lambda: fresh(run).status == "done", timeout=15, what="the approved run to finish")
    assert fresh(run).result == {"applied": True, "comment": "ship it", "by": api_person.actor}
    assert steps_of(log, run) == {"draft": 1, "update_crm": 1}
    api_person.did(run, "run.approved")
    stop(processes, worker)


def test_an_approved_run_killed_before_it_finishes_never_asks_again(
    tenant, api_person, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    first = started(processes, "--lease", "3", "--heartbeat", "1", "--poll", "0.2")
    run = submit_run(
        tenant=tenant, kind="approve_then_hold", input={"log": log, "hold_file": str(hold)}
    )
    wait_until(
        lambda: fresh(run).status == "waiting_human",
        timeout=15,
        what="the run to wait for approval",
    )
    assert act(api_person.client, run, "approve", {"comment": "go"}).status_code == 200
    wait_until(
        lambda: in_step(log, run, "act"), timeout=15, what="the step after the approval to start"
    )
    decided = Step.objects.get(run=run, seq=2).output

    kill(first)
    rescue(run)
    hold.unlink()
    second = processes.worker("--burst")
    assert second.wait(60) == 0, processes.output(second)

    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"approved": True, "comment": "go", "by": api_person.actor}
    approval = Step.objects.get(run=run, seq=2)
    assert (approval.status, approval.executions, approval.output) == ("done", 1, decided)
    assert steps_of(log, run) == {"draft": 1, "act": 2}  # only the interrupted step ran again
    assert event_types(run).count("run.waiting_human") == 1
    assert_events_consistent(run)


# --- messages -------------------------------------------------------------------------


def test_a_message_wakes_a_run_waiting_for_one(tenant, api_person, processes):
    # A long poll: the run is woken by the message's NOTIFY, not found by polling.
    worker = started(processes, "--poll", "30", "--heartbeat", "1")
    run = submit_run(tenant=tenant, kind="chat", input={})
    wait_until(
        lambda: fresh(run).status == "waiting", timeout=15, what="the run to wait for a message"
    )
    assert get(api_person.client, run)["waiting_for"] == {"type": "message"}

    response = act(api_person.client, run, "messages", {"text": "hello"})

    assert (response.status_code, response.json()["status"]) == (200, "queued")
    wait_until(
        lambda: Step.objects.filter(run=run, seq=2, status="done").exists(),
        timeout=10,
        what="the run to answer",
    )
    wait_until(lambda: fresh(run).status == "waiting", timeout=10, what="the run to wait again")
    hello = Message.objects.get(run=run)
    assert (hello.consumed_by_step.seq, hello.consumed_by_step.kind) == (1, "message")
    assert [m["text"] for m in hello.consumed_by_step.output] == ["hello"]

    assert act(api_person.client, run, "messages", {"text": "bye"}).status_code == 200
    wait_until(lambda: fresh(run).status == "done", timeout=10, what="the run to finish")
    assert fresh(run).result == {"seen": ["hello", "bye"]}
    assert not Message.objects.filter(run=run, consumed_by_step__isnull=True).exists()
    assert act(api_person.client, run, "messages", {"text": "anyone?"}).status_code == 409
    stop(processes, worker)


def test_messages_a_killed_worker_had_read_are_delivered_again_never_lost_nor_duplicated(
    tenant, api_person, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    run = submit_run(tenant=tenant, kind="inbox", input={"log": log, "hold_file": str(hold)})
    act(api_person.client, run, "messages", {"text": "first"})
    first = Message.objects.get(run=run)

    # The worker reads the message in its `messages` step; the checkpoint that would
    # consume it waits behind our lock on the message, and the worker dies there.
    with RowLock(Message.objects.filter(pk=first.pk)) as lock:
        a = processes.worker(
            "--lease", "3", "--heartbeat", "1", "--poll", "0.2", RUNS_APPLICATION_NAME="ctl-inbox-a"
        )

        def checkpoint_waits_on_the_message():
            return any(
                CHECKPOINT in query and lock.pid in blockers
                for _, query, blockers in backends_waiting_on_locks("ctl-inbox-a")
            )

        wait_until(
            checkpoint_waits_on_the_message,
            timeout=30,
            what="the messages step's checkpoint to wait",
        )
        kill(a)
        terminate_backends("ctl-inbox-a")  # the dead worker's statement never commits
    assert not Step.objects.filter(run=run).exists()
    assert Message.objects.get(pk=first.pk).consumed_by_step is None
    rescue(run)
    act(api_person.client, run, "messages", {"text": "second"})  # arrives while no worker is alive

    b = processes.worker("--lease", "3", "--heartbeat", "1", "--poll", "0.2")
    wait_until(
        lambda: any(n.startswith("handle:") for n in steps_of(log, run)),
        timeout=30,
        what="the messages to be handled",
    )
    read = Step.objects.get(run=run, seq=1)
    assert (read.kind, read.status, read.executions) == ("message", "done", 1)
    assert [m["text"] for m in read.output] == ["first", "second"]
    assert set(Message.objects.filter(run=run).values_list("consumed_by_step", flat=True)) == {
        read.pk
    }

    # Killed again, after the messages were recorded: the replay sees the same ones.
    kill(b)
    rescue(run)
    hold.unlink()
    c = processes.worker("--burst")
    assert c.wait(60) == 0, processes.output(c)

    run = fresh(run)
    assert run.status == "done"
    ids = list(Message.objects.filter(run=run).order_by("id").values_list("id", flat=True))
    assert run.result == {"handled": ["first", "second"], "ids": ids}
    assert steps_of(log, run) == {"handle:first|second": 2}
    read = Step.objects.get(run=run, seq=1)
    assert read.executions == 1
    assert set(Message.objects.filter(run=run).values_list("consumed_by_step", flat=True)) == {
        read.pk
    }
    assert_events_consistent(run)


def test_a_message_posted_while_the_worker_parks_the_run_still_wakes_it(
    tenant, api_person, processes
):
    """The exit to `waiting` re-checks for messages under the run's row lock (workers/queue.py).

    Staged: the worker's read of the inbox waits behind a table lock; a message is posted
    meanwhile and its transaction (holding the run row, as post_message does) stays open
    until the worker's exit statement waits for that row. Then the message commits.
    """
    run = submit_run(tenant=tenant, kind="chat", input={})

    def lock_the_inbox():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE runs_message IN ACCESS EXCLUSIVE MODE")

    def post():
        control.post_message(run=run, actor=Actor("api_key", str(api_person.key.pk)), text="hello")

    inbox_locked, posted = OpenTransaction(lock_the_inbox), OpenTransaction(post)
    try:
        inbox_locked.start().wait_worked()
        # No heartbeat during the test: the only write to the run row it waits for is the worker's exit.
        worker = started(
            processes, "--poll", "0.2", "--heartbeat", "30", RUNS_APPLICATION_NAME="ctl-parking"
        )
        wait_until(
            lambda: any(
                "runs_message" in q for _, q, _ in backends_waiting_on_locks("ctl-parking")
            ),
            timeout=15,
            what="the worker's read of the inbox to wait",
        )
        posted.start()
        wait_until(
            lambda: any(pid == posted.pid for pid, _, _ in backends_waiting_on_locks()),
            timeout=10,
            what="the message to wait for the inbox",
        )
        inbox_locked.commit()  # the worker reads an empty inbox; the message is written, not committed
        posted.wait_worked()
        wait_until(
            lambda: any(posted.pid in b for _, _, b in backends_waiting_on_locks("ctl-parking")),
            timeout=10,
            what="the worker's exit to wait for the run row",
        )

        posted.commit()

    finally:
        inbox_locked.release()
        posted.release()
    wait_until(lambda: fresh(run).status != "running", timeout=10, what="the run to leave running")
    wait_until(
        lambda: Message.objects.filter(run=run, consumed_by_step__isnull=False).exists(),
        timeout=10,
        what=f"the message to be consumed (the run is {fresh(run).status})",
    )
    wait_until(
        lambda: Step.objects.filter(run=run, seq=2, status="done").exists(),
        timeout=10,
        what="the run to answer",
    )
    stop(processes, worker)


def test_resume_before_the_step_boundary_withdraws_the_pause(
    tenant, api_person, processes, tmp_path
):
    log, hold = str(tmp_path / "exec.log"), tmp_path / "hold"
    hold.touch()
    worker = started(processes, "--concurrency", "1", "--poll", "0.2", "--heartbeat", "1")
    run = submit_run(
        tenant=tenant, kind="long_steps", input={"steps": 3, "log": log, "hold_file": str(hold)}
    )
    wait_until(
        lambda: in_step(log, run, "step1") and fresh(run).current_step == "step1",
        what="step1 to run",
    )
    assert act(api_person.client, run, "pause").status_code == 202
    heartbeat_since_now(run)  # the worker has heard of the pause

    response = act(api_person.client, run, "resume")

    assert response.status_code == 200, response.content
    assert (response.json()["status"], response.json()["pause_requested"]) == ("running", False)
    hold.unlink()
    wait_until(lambda: fresh(run).status in TERMINAL_STATUSES, timeout=15, what="the run to finish")
    run = fresh(run)
    assert run.status == "done"
    assert "run.paused" not in event_types(run)
    assert steps_of(log, run) == {"step1": 1, "step2": 1, "step3": 1}
    api_person.did(run, "run.resumed")  # the withdrawal is an action too: recorded with who did it
    stop(processes, worker)
