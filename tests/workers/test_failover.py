"""Failover: the primary dies mid-drain, its standby is promoted, and every process carries on by itself.

A primary and a streaming standby of the test's own (tests/support/pgcluster.py:
``pg_basebackup -R`` from the embedded server's binaries), the standby
synchronous (``synchronous_standby_names``), so that a commit the primary
acknowledged is on the standby too. Every process (the web, two workers, the
reaper, the webhook sender) has one ``DATABASE_URL`` naming both hosts with
``target_session_attrs=read-write``: a connection goes to whichever takes
writes. Runs are submitted through the API all along; the primary is
SIGKILLed with every process of its own (a machine lost) while runs are in
their steps, and the standby is promoted a second later, as pg_auto_failover
or Patroni would (docs/how-to/failover.md).

Then: every run the API accepted (202) is on the new primary and finishes;
a run the dead primary's workers held is rescued once its lease expires and
none is left running; once the API answers again it answers only 202; the
webhooks of runs finished after the failover arrive. The figures are
printed: runs accepted and lost, seconds from the kill to the API's first
202 and to the first run claimed on the new primary.
"""

from __future__ import annotations

import threading
import time

import httpx
import psycopg
import pytest

from tests.support.pgcluster import Cluster
from tests.support.waiting import wait_until
from tests.support.web import Web, bearer
from tests.support.webhook_receiver import Receiver

LEASE = 6
WORKER_ARGS = ("--concurrency", "4", "--lease", str(LEASE), "--heartbeat", "2", "--poll", "0.5")
BEFORE_SECONDS = 4  # of submits before the kill
AFTER_SECONDS = 12  # of submits after the promotion


@pytest.fixture
def pair(tmp_path):
    primary = Cluster(tmp_path / "primary", settings={"synchronous_standby_names": "*"}).start()
    standby = None
    try:
        standby = primary.standby(tmp_path / "standby").start()
        yield primary, standby
    finally:
        for server in (primary, standby):
            if server is not None:
                server.kill()


def one(url: str, query: str, *params):
    with psycopg.connect(url, connect_timeout=3) as conn:
        return conn.execute(query, params).fetchone()


def test_the_primary_killed_mid_drain_and_its_standby_promoted_loses_nothing(processes, pair):
    primary, standby = pair
    primary.create_database("failover")
    wait_until(
        lambda: (
            one(
                primary.url(), "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'"
            )[0]
            == 1
        ),
        timeout=30,
        what="the standby streaming, synchronous",
    )
    hosts = f"127.0.0.1:{primary.port},127.0.0.1:{standby.port}"
    url = f"postgres://postgres@{hosts}/failover?target_session_attrs=read-write"
    after = standby.url("failover")  # the new primary, once promoted
    env = {"DATABASE_URL": url, "RUNS_WEBHOOKS_ALLOW_PRIVATE": "1"}
    migrated = processes.run("migrate", "-v0", timeout=300, **env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert processes.run("createtenant", "acme", "--max-running", "100", **env).returncode == 0
    issued = processes.run("createapikey", "acme", **env)
    assert issued.returncode == 0, issued.stderr
    key = issued.stdout.strip().splitlines()[-1]

    receiver = Receiver()
    web = Web(processes, **env).start()
    workers = [processes.worker(*WORKER_ARGS, **env) for _ in range(2)]
    reaper = processes.manage("reap", "--interval", "1", **env)
    sender = processes.manage("deliverwebhooks", **env)

    accepted: list[tuple[float, str]] = []
    answers: list[tuple[float, int | str]] = []  # (when answered, status or the client's error)
    stop = threading.Event()

    def submit() -> None:
        with httpx.Client(headers=bearer(key), timeout=5) as client:
            while not stop.is_set():
                try:
                    response = client.post(
                        f"{web.base}/api/runs",
                        json={"kind": "steps", "input": {"steps": 3}, "callback_url": receiver.url},
                    )
                except httpx.HTTPError as exc:
                    answers.append((time.monotonic(), type(exc).__name__))
                    time.sleep(0.2)
                    continue
                at = time.monotonic()
                answers.append((at, response.status_code))
                if response.status_code == 202:
                    accepted.append((at, response.json()["id"]))
                time.sleep(0.05)

    submitter = threading.Thread(target=submit, daemon=True)
    submitter.start()
    try:
        time.sleep(BEFORE_SECONDS)
        wait_until(
            lambda: one(url, "SELECT count(*) FROM runs_run WHERE status = 'running'")[0] > 0,
            timeout=30,
            what="runs in their steps",
        )
        killed = time.monotonic()
        primary.kill()
        time.sleep(1)
        standby.promote()
        promoted = time.monotonic()
        [promoted_at] = one(after, "SELECT statement_timestamp()")
        time.sleep(AFTER_SECONDS)
    finally:
        stop.set()
        submitter.join(10)

    # Every run the API accepted is on the new primary, and finishes.
    ids = [run_id for _, run_id in accepted]
    [found] = one(after, "SELECT count(*) FROM runs_run WHERE id = ANY(%s::uuid[])", ids)
    lost = len(ids) - found
    wait_until(
        lambda: (
            one(
                after,
                "SELECT count(*) FROM runs_run WHERE id = ANY(%s::uuid[]) AND status = 'done'",
                ids,
            )[0]
            == len(ids)
        ),
        timeout=120,
        interval=0.5,
        what=lambda: (
            "every accepted run done: "
            + str(
                one(
                    after,
                    "SELECT json_object_agg(status, n) FROM (SELECT status, count(*) AS n "
                    "FROM runs_run GROUP BY status) s",
                )[0]
            )
        ),
    )
    [rescued] = one(
        after, "SELECT count(*) FROM runs_event WHERE payload->>'reason' = 'lease_expired'"
    )
    [first_claim] = one(
        after,
        "SELECT extract(epoch FROM min(claimed_at) - %s) FROM runs_run WHERE claimed_at >= %s",
        promoted_at,
        promoted_at,
    )
    # Once the API answers again, it answers 202 only.
    recovered = min((at for at, status in answers if at > killed and status == 202), default=None)
    assert recovered is not None, answers[-20:]
    after_recovery = [status for at, status in answers if at > recovered]
    failed = [status for at, status in answers if killed < at < recovered and status != 202]
    print(
        f"failover: {len(ids)} runs accepted, {lost} lost, {rescued} rescued after their lease; "
        f"API answering 202 again {recovered - killed:.1f} s after the kill "
        f"({recovered - promoted:+.1f} s from the promotion; {len(failed)} requests failed "
        f"meanwhile: {sorted(set(map(str, failed)))}); first claim on the new primary {first_claim:.1f} s after its promotion"
    )
    assert lost == 0
    assert set(after_recovery) == {202}, after_recovery
    # The webhook sender carried on: the last accepted run's end was delivered.
    last = ids[-1]
    wait_until(
        lambda: any(last in r.body and '"run.done"' in r.body for r in receiver.received),
        timeout=60,
        what="the webhook of the last run's end",
    )
    for proc in (*workers, reaper, sender, web.proc):
        assert proc.poll() is None, processes.output(proc)
    receiver.stop()
