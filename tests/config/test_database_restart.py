"""PostgreSQL restarts (or crashes) under a web process, a worker and the reaper: they carry on.

The server is the test's own (tests/support/pgcluster.py), so that it can be
stopped under its clients. After it is back, the first request the web
process answers must not be an error from a connection the restart broke,
and a run submitted then must be claimed and finished: every process's
connection pool checks a connection before lending it, and tries again
soon after the server comes back rather than after a growing backoff
(config/settings.py, ``_database``). The seconds from the server accepting
connections to the run's start are printed (by the database's clock:
``pg_postmaster_start_time()`` against the run's ``started_at``).
"""

from __future__ import annotations

import time

import httpx
import psycopg
import pytest

from tests.support.pgcluster import Cluster
from tests.support.waiting import wait_until
from tests.support.web import Web, bearer

# Long enough for the pool's attempts to connect to back off (1, 2, 4 s ... uncapped).
DOWN_SECONDS = 8
WORKER_ARGS = ("--concurrency", "2", "--lease", "6", "--heartbeat", "2", "--poll", "0.5")


@pytest.fixture
def cluster(tmp_path):
    server = Cluster(tmp_path / "pg").start()
    yield server
    server.stop("immediate")


def run_row(url: str, run_id: str) -> dict | None:
    with psycopg.connect(url, connect_timeout=2) as conn:
        row = conn.execute(
            "SELECT status, started_at, started_at - pg_postmaster_start_time() AS after_up "
            "FROM runs_run WHERE id = %s",
            [run_id],
        ).fetchone()
    return None if row is None else {"status": row[0], "started_at": row[1], "after_up": row[2]}


@pytest.mark.parametrize("how", ["restart", "crash"])
def test_web_worker_and_reaper_carry_on_once_postgresql_is_back(processes, cluster, how):
    url = cluster.create_database("restarts")
    env = {"DATABASE_URL": url}
    migrated = processes.run("migrate", "-v0", timeout=300, **env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert processes.run("createtenant", "acme", **env).returncode == 0
    issued = processes.run("createapikey", "acme", **env)
    assert issued.returncode == 0, issued.stderr
    key = issued.stdout.strip().splitlines()[-1]

    web = Web(processes, **env).start()
    worker = processes.worker(*WORKER_ARGS, **env)
    reaper = processes.manage("reap", "--interval", "1", **env)

    def submit(i: int) -> str:
        response = httpx.post(
            f"{web.base}/api/runs",
            json={"kind": "steps", "input": {"steps": 2}},
            headers=bearer(key),
            timeout=10,
        )
        assert response.status_code == 202, response.text
        return response.json()["id"]

    def done(run_id: str) -> bool:
        row = run_row(url, run_id)
        return row is not None and row["status"] == "done"

    before = submit(0)
    wait_until(lambda: done(before), timeout=30, what="a run done before the restart")

    if how == "restart":
        cluster.stop("fast")
    else:
        cluster.kill()
    time.sleep(
        DOWN_SECONDS
    )  # the processes' connections and their attempts to reconnect fail meanwhile
    cluster.start()  # returns once the server accepts connections

    # The first request after the server is back, a read of the database, answers 200.
    first = httpx.get(f"{web.base}/api/runs", headers=bearer(key), timeout=10)
    assert first.status_code == 200, first.text
    after = submit(1)
    wait_until(lambda: done(after), timeout=30, what="a run submitted after the restart, done")
    row = run_row(url, after)
    assert row is not None
    print(f"{how}: run started {row['after_up'].total_seconds():.2f} s after PostgreSQL was back")
    for proc in (worker, reaper, web.proc):
        assert proc.poll() is None, processes.output(proc)
