"""Statements that write several runs (or several tenants) lock them in one order: they never deadlock.

The heartbeat, the committer's batched checkpoints and exits, the claim and
the reaper each update many rows in one statement; two of them that took
the same rows in different orders would deadlock, and the one PostgreSQL
aborts is a lost heartbeat (its runs abandoned until their leases expire)
or a batch written again one by one.
"""

from __future__ import annotations

import functools
import signal
import threading
from decimal import Decimal
from uuid import uuid4

import pytest
from django.db import connection, connections, transaction

from runs.engine import claim as claims
from runs.engine import steps as checkpoint
from runs.engine.exit import Exit, leave_many
from runs.models import Run
from runs.services import submit_run
from tests.runs.engine.test_group_commit import finished_step
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.committer import Committer, _Request

WORKER_ID = uuid4()
ROUNDS = 60


def deadlocks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        return cursor.fetchone()[0]


def claim(tenants, per_tenant, *, cents=Decimal(0)):
    with transaction.atomic():
        for tenant in tenants:
            for _ in range(per_tenant):
                submit_run(tenant=tenant, kind="noop3", input={})
    claimed = claims.claim(
        worker_id=WORKER_ID,
        queues=["default"],
        kinds={"noop3": 1},
        n=len(tenants) * per_tenant,
        lease=60,
    )
    assert len(claimed) == len(tenants) * per_tenant
    return sorted(claimed, key=lambda c: c.id)


def concurrently(*bodies) -> list[BaseException]:
    """Each body on a thread of its own (its own connection), started together; the errors they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(len(bodies))

    def run(body):
        try:
            start.wait()
            body()
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(body,)) for body in bodies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return errors


def heartbeats(claimed, rounds, *, lost: list | None = None):
    """The heartbeat of ``claimed``, in their order; runs missing from its answers go to ``lost``."""
    held = {c.lease_token: c.id for c in claimed}

    def beat():
        for _ in range(rounds):
            alive = claims.heartbeat(worker_id=WORKER_ID, held=held, lease=60)
            if lost is not None:
                lost.extend(set(held) - set(alive))

    return beat


@pytest.mark.django_db(transaction=True)
def test_heartbeat_and_batched_checkpoints_in_opposite_orders_never_deadlock():
    tenants = [TenantFactory() for _ in range(4)]
    claimed = claim(tenants, 6)
    before = deadlocks()

    def checkpoints():
        # The committer's batch, in the opposite order of the heartbeat's; with costs, so the
        # tenants' spend of the day is written too.
        for seq in range(1, ROUNDS + 1):
            items = [finished_step(c, seq=seq, cost=Decimal("0.01")) for c in reversed(claimed)]
            answers = checkpoint.checkpoint_many(items, worker_id=WORKER_ID, lease=60)
            assert all(answer is not None for answer in answers), (
                "a checkpoint found its lease lost"
            )

    def checkpoints_in_halves():
        # Another worker's committer on the same tenants' spend, its runs in yet another order.
        others = claim(tenants, 3)
        for seq in range(1, ROUNDS + 1):
            items = [
                finished_step(c, seq=seq, cost=Decimal("0.01")) for c in others[1::2] + others[::2]
            ]
            checkpoint.checkpoint_many(items, worker_id=WORKER_ID, lease=60)

    lost: list[int] = []
    errors = concurrently(
        heartbeats(claimed, ROUNDS, lost=lost),
        checkpoints,
        heartbeats(list(reversed(claimed)), ROUNDS, lost=lost),
        checkpoints_in_halves,
    )
    assert errors == [], errors
    assert (
        lost == []
    )  # a run the worker holds, missing from a heartbeat's answer, would be abandoned
    assert deadlocks() == before


@pytest.mark.django_db(transaction=True)
def test_heartbeat_and_batched_exits_in_opposite_orders_never_deadlock():
    tenants = [TenantFactory(max_running=500) for _ in range(4)]
    before = deadlocks()
    errors = []
    for _ in range(12):
        claimed = claim(tenants, 5)
        exits = [
            (Exit.release(reason="released") if i % 3 else Exit.done(result="{}")).of_run(
                c.id, c.lease_token
            )
            for i, c in enumerate(reversed(claimed))
        ]
        # The exits give slots back and requeue runs of every tenant: each tenant row is written too.
        errors += concurrently(
            heartbeats(claimed, 1),
            functools.partial(leave_many, exits[::2]),
            heartbeats(list(reversed(claimed)), 1),
            functools.partial(leave_many, exits[1::2]),
        )
    assert errors == [], errors
    assert deadlocks() == before
    assert not Run.objects.filter(status="running").exists()


@pytest.mark.django_db(transaction=True)
def test_heartbeat_and_the_committer_s_checkpoints_and_exits_in_one_transaction_never_deadlock():
    """The committer commits a batch's checkpoints and exits together: both statements' runs in one order."""
    tenants = [TenantFactory(max_running=500) for _ in range(2)]
    committer = Committer(worker_id=WORKER_ID, lease=60)
    before = deadlocks()
    errors = []
    for _ in range(15):
        claimed = claim(tenants, 8)
        # The exits' runs come first in id order, the checkpoints' after: locked statement by
        # statement, the transaction would take the later ones first.
        leaving, stepping = claimed[:8], claimed[8:]
        batch = [_Request(finished_step(c)) for c in reversed(stepping)]
        batch += [
            _Request(Exit.done(result="{}").of_run(c.id, c.lease_token)) for c in reversed(leaving)
        ]
        # What the committer's thread does with a batch (Committer._write): one transaction.
        errors += concurrently(
            heartbeats(claimed, 3),
            functools.partial(committer._write, batch),
            heartbeats(claimed[1::2] + claimed[::2], 3),
        )
    assert errors == [], errors
    assert deadlocks() == before


@pytest.mark.django_db(transaction=True)
def test_busy_workers_with_a_short_heartbeat_never_deadlock(processes):
    """1,500 eight-step runs of six tenants, two workers of 30 at a time, heartbeat every 0.2 s: no deadlock."""
    tenants = [TenantFactory(max_running=500, max_queued=1000) for _ in range(6)]
    with transaction.atomic():
        # Half of them spend money: their checkpoints write their tenants' spend of the day too.
        runs = [
            submit_run(
                tenant=tenants[i % len(tenants)],
                kind="steps" if i % 2 else "spender",
                input={"steps": 8} if i % 2 else {"steps": 8, "cents": 0.01},
            )
            for i in range(1500)
        ]
    before = deadlocks()
    workers = [
        processes.worker(
            "--concurrency", "30", "--heartbeat", "0.2", "--lease", "2", "--poll", "0.1"
        )
        for _ in range(2)
    ]
    wait_until(
        lambda: Run.objects.filter(status="done").count() == len(runs),
        timeout=600,
        what="every run done",
    )
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    for worker in workers:
        assert worker.wait(60) == 0, processes.output(worker)

    def workers_gone():
        # Their backends flush their statistics (the deadlocks counted there) as they end.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'agentruns runworker'"
            )
            return cursor.fetchone()[0] == 0

    wait_until(workers_gone, timeout=30, what="the workers' connections to close")
    logs = "".join(processes.output(worker) for worker in workers)
    assert (
        "heartbeat failed" not in logs
    )  # a lost heartbeat: its runs abandoned until their leases expire
    assert deadlocks() == before
