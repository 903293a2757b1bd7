"""Economics (README.md, "When things go wrong"): per-tenant max_running, queues, priorities, paused queues, max_queued.

Real PostgreSQL throughout; where workers are involved they are real
``runworker`` processes, and the test watches the database from outside.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from runs.engine import claim as claims
from runs.engine.exit import Exit, leave
from runs.exceptions import InvalidRunInput, QueueFull
from runs.models import Queue, Run, Tenant, Worker
from runs.registry import all_kinds
from runs.services import submit_run
from tests.support.agents import executions
from tests.support.backlog import backlog_rows
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.reaper import Reaper

processes_db = pytest.mark.django_db(transaction=True)


def live_workers(n: int) -> None:
    wait_until(
        lambda: Worker.objects.filter(stopped_at__isnull=True).count() == n,
        what=f"{n} workers to register",
    )


def stop(processes, *procs) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.wait(30) == 0, processes.output(proc)


def counters(tenant: Tenant) -> tuple[int, int]:
    return Tenant.objects.values_list("running", "queued").get(pk=tenant.pk)


def pids_by_run(log: str) -> dict[str, set[int]]:
    pids: dict[str, set[int]] = {}
    for run_id, _, _, pid in executions(log):
        pids.setdefault(run_id, set()).add(pid)
    return pids


# --- per-tenant max_running ---------------------------------------------------------


@processes_db
def test_four_workers_never_run_more_than_max_running_of_a_tenant_while_another_tenant_proceeds(
    processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    a = TenantFactory(max_running=2)
    b = TenantFactory(max_running=50)
    workers = [processes.worker("--concurrency", "4", "--poll", "0.1") for _ in range(4)]
    live_workers(4)

    work = {"steps": 3, "step_seconds": 0.2, "log": log}
    # One commit: the four idle workers are woken together and race for A's two slots.
    with transaction.atomic():
        a_runs = [submit_run(tenant=a, kind="steps", input=work) for _ in range(12)]
        b_runs = [submit_run(tenant=b, kind="steps", input=work) for _ in range(12)]

    samples = []  # (A running rows, A's counter, B running rows, A queued rows, A done, B done)

    def sample() -> bool:
        seen = Run.objects.aggregate(
            a_running=Count("pk", filter=Q(tenant=a, status="running")),
            b_running=Count("pk", filter=Q(tenant=b, status="running")),
            a_queued=Count("pk", filter=Q(tenant=a, status="queued")),
            a_done=Count("pk", filter=Q(tenant=a, status="done")),
            b_done=Count("pk", filter=Q(tenant=b, status="done")),
        )
        a_counter = Tenant.objects.values_list("running", flat=True).get(pk=a.pk)
        samples.append(seen | {"a_counter": a_counter})
        assert seen["a_running"] <= 2, samples[-1]
        assert a_counter <= 2, samples[-1]
        return seen["a_done"] == len(a_runs) and seen["b_done"] == len(b_runs)

    wait_until(  # about 7 s on an idle machine
        sample,
        timeout=60,
        interval=0.02,
        what=lambda: f"every run to be done; last sample {samples[-1]}",
    )

    stop(processes, *workers)
    # The limit was reached (the sampler saw it), not merely never approached.
    assert max(s["a_running"] for s in samples) == 2
    # B was not throttled to A's pace: many of its runs ran at once, and all
    # of them were done while A still had runs waiting for a slot.
    assert max(s["b_running"] for s in samples) > 2
    assert any(s["b_done"] == len(b_runs) and s["a_queued"] > 0 for s in samples), samples[-1]
    assert Run.objects.exclude(status="done").count() == 0
    assert counters(a)[0] == counters(b)[0] == 0
    # Every step ran exactly once, so no run was claimed twice.
    assert len(executions(log)) == 3 * (len(a_runs) + len(b_runs))
    # The queued counters are approximate (raised after commit, possibly after
    # a claim lowered them); the reaper makes them true again.
    Reaper().reconcile_tenants()
    assert counters(a) == counters(b) == (0, 0)


@pytest.mark.django_db
def test_a_tenant_at_its_limit_with_1000_queued_does_not_delay_another_tenants_run(
    django_assert_num_queries,
):
    kinds = {k.name: k.version for k in all_kinds()}
    worker_id = uuid.uuid4()

    def claim(n: int):
        return claims.claim(worker_id=worker_id, queues=["default"], kinds=kinds, n=n, lease=300)

    a = TenantFactory(max_running=2, max_queued=10_000)
    b = TenantFactory()
    held = [submit_run(tenant=a, kind="steps", input={"steps": 1}) for _ in range(2)]
    held_claims = claim(2)
    assert {c.id for c in held_claims} == {r.id for r in held}
    # A's backlog wins on every ordering criterion (priority 0, older than B's run).
    Run.objects.bulk_create(backlog_rows(a, 1000, priority=0))
    Reaper().reconcile_tenants()
    assert counters(a) == (2, 1000)

    b_run = submit_run(tenant=b, kind="steps", input={"steps": 1}, priority=9)
    with django_assert_num_queries(2):  # the claim and its counters, whatever A has queued
        got = claim(1)

    assert [c.id for c in got] == [b_run.id]
    assert claim(10) == []  # nothing else is claimable: A is at its limit
    assert counters(a) == (2, 1000)
    assert Run.objects.filter(tenant=a, status="running").count() == 2

    # A slot frees up: the very next claim takes exactly one of A's runs, its best.
    finished = held_claims[0]
    assert leave(Exit.done(result="{}").of_run(finished.id, finished.lease_token))
    refill = claim(10)
    assert len(refill) == 1
    assert (refill[0].tenant_id, Run.objects.get(pk=refill[0].id).priority) == (a.pk, 0)
    assert counters(a) == (2, 999)


# --- queues and priorities -----------------------------------------------------------


@processes_db
def test_workers_only_execute_runs_of_their_queues(tenant, processes, tmp_path):
    log = str(tmp_path / "exec.log")
    work = {"steps": 2, "step_seconds": 0.05, "log": log}
    short_runs = [
        submit_run(tenant=tenant, kind="steps", queue="short", input=work) for _ in range(4)
    ]
    long_runs = [
        submit_run(tenant=tenant, kind="steps", queue="long", input=work) for _ in range(4)
    ]

    short_worker = processes.worker("--queues", "short", "--concurrency", "2", "--poll", "0.1")
    live_workers(1)
    wait_until(
        lambda: Run.objects.filter(queue="short", status="done").count() == 4,
        what="short runs done",
    )
    # Idle since, and polling every 0.1 s: still, it leaves the long runs alone. Nothing to wait for:
    # this second of ten polls that claim nothing is the behaviour under test.
    time.sleep(1.0)
    assert set(Run.objects.filter(queue="long").values_list("status", "attempt")) == {("queued", 0)}

    long_worker = processes.worker("--queues", "long", "--concurrency", "2", "--poll", "0.1")
    wait_until(
        lambda: Run.objects.filter(queue="long", status="done").count() == 4,
        what="long runs done",
    )
    stop(processes, short_worker, long_worker)

    pids = pids_by_run(log)
    assert all(pids[str(run.id)] == {short_worker.pid} for run in short_runs), pids
    assert all(pids[str(run.id)] == {long_worker.pid} for run in long_runs), pids


@processes_db
def test_a_worker_runs_by_priority_then_started_before_fresh_then_age(tenant, processes, tmp_path):
    log = str(tmp_path / "exec.log")
    work = {"steps": 1, "log": log}
    runs = {
        name: submit_run(tenant=tenant, kind="steps", input=work, priority=p)
        for name, p in [("p9", 9), ("p0", 0), ("p5a", 5), ("p5b", 5), ("p5_retried", 5)]
    }
    # Of the two fresh priority-5 runs, the one with the larger id is the
    # older, so an order by id alone would get them the wrong way round.
    older, newer = sorted([runs["p5a"], runs["p5b"]], key=lambda r: r.id, reverse=True)
    now = timezone.now()
    minutes_ago = {runs["p9"]: 50, older: 40, newer: 30, runs["p0"]: 20, runs["p5_retried"]: 10}
    for run, minutes in minutes_ago.items():
        Run.objects.filter(pk=run.pk).update(run_after=now - timedelta(minutes=minutes))
    # A retried run: it started once before (and is the newest in the queue).
    Run.objects.filter(pk=runs["p5_retried"].pk).update(
        started_at=now - timedelta(minutes=15), attempt=1
    )

    worker = processes.worker("--concurrency", "1", "--poll", "0.1")
    wait_until(lambda: Run.objects.filter(status="done").count() == 5, what="all runs done")
    stop(processes, worker)

    order = [run_id for run_id, _, _, _ in executions(log)]
    expected = [runs["p0"], runs["p5_retried"], older, newer, runs["p9"]]
    assert order == [str(r.id) for r in expected]


@processes_db
def test_a_paused_queue_is_not_claimed_from_until_resumed(tenant, processes, tmp_path):
    log = str(tmp_path / "exec.log")
    Queue.objects.create(name="long", paused=True, paused_at=timezone.now())
    work = {"steps": 1, "log": log}
    long_runs = [
        submit_run(tenant=tenant, kind="steps", queue="long", input=work) for _ in range(3)
    ]
    short_runs = [
        submit_run(tenant=tenant, kind="steps", queue="short", input=work) for _ in range(2)
    ]

    # One worker on the paused queue alone, one on it and an active queue
    # (the claim filters one queue and several queues differently).
    long_only = processes.worker("--queues", "long", "--poll", "0.1")
    both = processes.worker("--queues", "short,long", "--poll", "0.1")
    live_workers(2)
    polling_since = time.monotonic()
    wait_until(
        lambda: Run.objects.filter(queue="short", status="done").count() == 2,
        what="short runs done",
    )
    # ~20 polls of each worker that claim nothing: the behaviour under test, not a wait for something.
    time.sleep(max(0.0, 2.0 - (time.monotonic() - polling_since)))
    assert set(Run.objects.filter(queue="long").values_list("status", "attempt")) == {("queued", 0)}
    assert counters(tenant)[0] == 0

    Queue.objects.filter(name="long").update(paused=False, paused_at=None)
    wait_until(
        lambda: Run.objects.filter(queue="long", status="done").count() == 3,
        timeout=20,
        what="long runs done",
    )
    stop(processes, long_only, both)

    pids = pids_by_run(log)
    assert all(pids[str(run.id)] == {both.pid} for run in short_runs), pids
    assert all(pids[str(run.id)] <= {long_only.pid, both.pid} for run in long_runs), pids


# --- max_queued (backpressure) --------------------------------------------------------

ECHO = {"kind": "echo", "input": {"text": "hello"}}


def post_run(client, body: dict | str):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post("/api/runs", data=data, content_type="application/json")


def assert_error(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"].strip()
    return body


@processes_db
def test_max_queued_refuses_submits_until_a_worker_drains_and_the_reaper_reconciles(
    api, tenant, processes
):
    Tenant.objects.filter(pk=tenant.pk).update(max_queued=3)
    assert [post_run(api, ECHO).status_code for _ in range(3)] == [202, 202, 202]
    # The counter is raised after commit, debounced: the last increments may still be on their way.
    wait_until(
        lambda: counters(tenant) == (0, 3),
        timeout=5,
        what="the queued counter to count all three",
    )

    refused = post_run(api, ECHO)
    detail = assert_error(refused, 429)["detail"]
    assert "queue is full" in detail and "limit 3" in detail
    assert int(refused["Retry-After"]) >= 1
    with pytest.raises(QueueFull) as caught:
        submit_run(tenant=tenant, kind="echo", input={"text": "service"})
    assert caught.value.retry_after >= 1
    assert Run.objects.count() == 3
    assert counters(tenant) == (0, 3)

    drain = processes.worker("--burst")
    assert drain.wait(30) == 0, processes.output(drain)
    assert set(Run.objects.values_list("status", flat=True)) == {"done"}
    assert counters(tenant) == (0, 0)
    assert post_run(api, ECHO).status_code == 202

    # A counter that drifted (say an after-commit increment that raced a
    # claim) refuses submits wrongly until the reaper sets it to the truth.
    Tenant.objects.filter(pk=tenant.pk).update(queued=3)
    assert_error(post_run(api, ECHO), 429)
    assert Reaper().reconcile_tenants() == 1
    assert counters(tenant) == (0, Run.objects.filter(status="queued").count()) == (0, 1)
    assert [post_run(api, ECHO).status_code for _ in range(3)] == [202, 202, 429]
    assert Run.objects.filter(status="queued").count() == 3


@processes_db
def test_runs_claimed_before_their_count_lands_do_not_fill_the_queue(tenant):
    Tenant.objects.filter(pk=tenant.pk).update(max_queued=3)
    kinds = {k.name: k.version for k in all_kinds()}
    claimed = []
    with transaction.atomic():
        # Registered first, so it runs right after the commit, before the
        # submits' own callbacks raise the counter: a worker that polls at
        # that moment (seen with real workers in the max_running test above).
        transaction.on_commit(
            lambda: claimed.extend(
                claims.claim(worker_id=uuid.uuid4(), queues=["default"], kinds=kinds, n=3, lease=60)
            )
        )
        for text in ("a", "b", "c"):
            submit_run(tenant=tenant, kind="echo", input={"text": text})
    assert len(claimed) == 3
    for run in claimed:
        leave(Exit.done(result="{}").of_run(run.id, run.lease_token))
    assert not Run.objects.filter(status="queued").exists()

    # Nothing is queued, so the tenant has room for three more.
    submit_run(tenant=tenant, kind="echo", input={"text": "d"})


# --- bad input (what tests/runs/api/test_submit.py does not already cover) ----------------


@pytest.mark.usefixtures("no_new_runs")
class TestBadInput:
    def test_a_body_over_the_default_256_kib_is_413(self, api, settings):
        # The default limit, not a test override.
        assert settings.DATA_UPLOAD_MAX_MEMORY_SIZE == 256 * 1024
        body = json.dumps({"kind": "echo", "input": {"text": "x" * (256 * 1024)}})

        detail = assert_error(post_run(api, body), 413)["detail"]
        assert "larger than the limit" in detail

    @pytest.mark.parametrize("raw", ["{not json", '{"kind": "echo", "input": {"text": "a"}'])
    def test_malformed_json_is_400(self, api, raw):
        assert_error(post_run(api, raw), 400)

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("priority", "high"),
            ("input", "a string"),
            ("max_attempts", "x"),
            ("cost_ceiling_cents", -1),
            ("deadline_seconds", "soon"),
        ],
    )
    def test_a_field_of_the_wrong_type_or_range_is_422_naming_it(self, api, field, value):
        body = assert_error(post_run(api, {**ECHO, field: value}), 422)

        assert field in body["detail"]
        assert [err["loc"][-1] for err in body["errors"]] == [field]

    @pytest.mark.parametrize(
        ("options", "word"),
        [
            ({"priority": 10}, "priority"),
            ({"priority": -1}, "priority"),
            ({"cost_ceiling_cents": -1}, "cost_ceiling_cents"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"deadline_seconds": 0}, "deadline_seconds"),
            ({"queue": "nobody-serves-this"}, "unknown queue"),
        ],
    )
    def test_submit_run_refuses_the_same_input_as_the_api(self, tenant, options, word):
        with pytest.raises(InvalidRunInput, match=word):
            submit_run(tenant=tenant, kind="echo", input={"text": "a"}, **options)
