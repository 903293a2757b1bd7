"""No deadlock under load on one tenant: 4 worker processes and 8 submitting threads for a minute.

Every statement that writes several rows locks them in one order (runs by
id, then tenants by id, then kinds and queues by name; the heartbeat writes
its worker's row only), so PostgreSQL never has to break a cycle. The server
is the test's own (tests/support/pgcluster.py), with ``log_lock_waits`` on
and a short ``deadlock_timeout``, so that its log shows every wait longer
than 200 ms and every deadlock it broke; a deadlock is also counted in
``pg_stat_database``. The runs all finish, each once, and the tenant's
counters end true.
"""

from __future__ import annotations

import re
import signal
import textwrap

import psycopg
import pytest

from tests.support.pgcluster import Cluster
from tests.support.waiting import wait_until

SECONDS = 60
THREADS = 8
WORKERS = 4
WORKER_ARGS = ("--concurrency", "8", "--lease", "10", "--heartbeat", "1", "--poll", "0.2")

DONE = "SELECT count(*) FROM runs_run WHERE status = 'done'"

SUBMITTERS = textwrap.dedent(
    f"""
    import threading, time, traceback
    from django.db import connection, transaction
    from runs.models import Tenant
    from runs.services import submit_run

    tenant = Tenant.objects.get(slug="acme")
    until = time.monotonic() + {SECONDS}
    done, failed = [0] * {THREADS}, [0] * {THREADS}

    def submit(i):
        try:
            while time.monotonic() < until:
                try:
                    with transaction.atomic():
                        submit_run(tenant=tenant, kind="steps", input={{"steps": 2}})
                    done[i] += 1
                except Exception:
                    failed[i] += 1
                    traceback.print_exc()
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range({THREADS})]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print("SUBMITTED", sum(done), "FAILED", sum(failed), flush=True)
    """
)


@pytest.fixture
def cluster(tmp_path):
    server = Cluster(tmp_path / "pg").start()
    yield server
    server.stop("immediate")


def test_four_workers_and_eight_submitters_on_one_tenant_never_deadlock(processes, cluster):
    url = cluster.create_database("load")
    env = {"DATABASE_URL": url}
    migrated = processes.run("migrate", "-v0", timeout=300, **env)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    created = processes.run(
        "createtenant", "acme", "--max-running", "1000", "--max-queued", "10000000", **env
    )
    assert created.returncode == 0, created.stderr
    log_start = len(cluster.log_text())

    workers = [processes.worker(*WORKER_ARGS, **env) for _ in range(WORKERS)]
    submitters = processes.run("shell", "-c", SUBMITTERS, timeout=SECONDS + 120, **env)
    assert submitters.returncode == 0, submitters.stderr[-3000:]
    found = re.search(r"SUBMITTED (\d+) FAILED (\d+)", submitters.stdout)
    assert found, submitters.stdout + submitters.stderr[-3000:]
    submitted, failed = int(found.group(1)), int(found.group(2))
    assert failed == 0, submitters.stderr[-3000:]
    assert submitted > 0

    def count(query: str) -> int:
        with psycopg.connect(url) as conn:
            return conn.execute(query).fetchone()[0]

    wait_until(
        lambda: count(DONE) == submitted,
        timeout=300,
        interval=0.5,
        what=lambda: f"all {submitted} runs done ({count(DONE)} are)",
    )
    for worker in workers:
        assert worker.poll() is None, processes.output(worker)
        worker.send_signal(signal.SIGTERM)  # a graceful stop gives the tenant's slots back
    for worker in workers:
        assert worker.wait(60) == 0, processes.output(worker)

    log = cluster.log_text()[log_start:]
    waits = log.count("still waiting for")
    deadlocks = log.count("deadlock detected")
    print(
        f"{submitted} runs submitted by {THREADS} threads in {SECONDS} s and run by {WORKERS} "
        f"workers: {deadlocks} deadlocks, {waits} lock waits over 200 ms in the server log"
    )
    assert deadlocks == 0, "\n".join(
        line for line in log.splitlines() if "deadlock" in line or "Process " in line
    )[:5000]
    assert count("SELECT deadlocks FROM pg_stat_database WHERE datname = 'load'") == 0
    # Each run ran once: one claim, its two steps recorded once each.
    assert count("SELECT count(*) FROM runs_run WHERE attempt <> 1") == 0
    assert count("SELECT count(*) FROM runs_step") == 2 * submitted
    assert count("SELECT running FROM runs_tenant WHERE slug = 'acme'") == 0
