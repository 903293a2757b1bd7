"""The web process, two workers and the reaper, all through a real PgBouncer in transaction-pooling mode.

With ``RUNS_LISTEN=0`` and ``RUNS_DB_PREPARE=0`` nothing may need a server
connection beyond one transaction: runs are claimed, heartbeated and
checkpointed step by step, an approval is given through the API while an
event stream follows the run, and the reaper rescues the run of a SIGKILLed
worker for the other one to finish. PgBouncer's pools are smaller than the
workers' connection pools, so the work only gets done if PgBouncer really
multiplexes transactions (tests/support/pgbouncer.py).

Each test runs once more with prepared statements on (``RUNS_DB_PREPARE=1``
and ``max_prepared_statements``), which needs PgBouncer 1.21 or newer; with
an older one those cases are skipped (1.18 refuses the setting, and the
connections that prepare, the event hub's, fail: "prepared statement
"_pg3_0" does not exist"). Django's own cursors bind parameters on the
client and never prepare.
"""

from __future__ import annotations

import json
import signal
import threading
from collections import Counter

import httpx
import psycopg
import pytest
from django.db import connections
from django.utils import timezone

from runs.db import connection_kwargs
from runs.models import Run, Tenant, Worker
from tests.conftest import test_database_url as database_url
from tests.support.agents import executions
from tests.support.factories import TenantFactory
from tests.support.pgbouncer import PgBouncer, pgbouncer_version, require_pgbouncer
from tests.support.waiting import wait_until
from tests.support.web import SSE, Web, bearer, read_events

pytestmark = pytest.mark.django_db(transaction=True)

# Server connections per pool: fewer than one worker's client connections
# (RUNS_DB_POOL_MIN below), which transaction pooling multiplexes onto them.
POOL_SIZE = 3
ALIASES = ("web", "workers", "reaper")
WORKER_ARGS = ("--concurrency", "4", "--lease", "3", "--heartbeat", "1", "--poll", "0.2")


@pytest.fixture(params=[0, 100], ids=["prepare-off", "prepare-on"])
def pgbouncer(request, transactional_db, tmp_path):
    """PgBouncer in transaction mode; with ``max_prepared_statements`` (1.21+) its clients prepare statements."""
    executable = require_pgbouncer()
    version = pgbouncer_version(executable)
    if request.param and version < (1, 21):
        pytest.skip(
            f"PgBouncer {'.'.join(map(str, version))} is installed; prepared statements in "
            "transaction mode need max_prepared_statements (1.21+): run with RUNS_DB_PREPARE=0"
        )
    bouncer = PgBouncer(
        executable,
        tmp_path,
        upstream=database_url(),
        aliases=ALIASES,
        pool_size=POOL_SIZE,
        max_prepared_statements=request.param,
    ).start()
    yield bouncer
    bouncer.stop()


class Stream(threading.Thread):
    """Follows one run's event stream to its end, in the background."""

    def __init__(self, url: str, api_key: str):
        super().__init__(daemon=True)
        self.url, self.api_key = url, api_key
        self.seen: list[SSE] = []
        self.status: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with httpx.stream(
                "GET", self.url, headers=bearer(self.api_key), timeout=30
            ) as response:
                self.status = response.status_code
                read_events(response, seen=self.seen)
        except BaseException as exc:  # reported by the test
            self.error = exc


def test_web_workers_and_reaper_through_pgbouncer_in_transaction_mode(
    tenant, api_key, pgbouncer, processes, tmp_path
):
    log = str(tmp_path / "exec.log")
    pooled = (
        pgbouncer.client_env
    )  # RUNS_LISTEN=0, RUNS_DB_PREPARE=0 (or 1 with max_prepared_statements)
    web = Web(
        processes, DATABASE_URL=pgbouncer.url("web"), RUNS_STREAM_POLL_SECONDS="0.2", **pooled
    ).start()

    def submit(kind: str, data: dict) -> str:
        response = httpx.post(
            f"{web.base}/api/runs",
            json={"kind": kind, "input": data},
            headers=bearer(api_key),
            timeout=10,
        )
        assert response.status_code == 202, response.text
        return response.json()["id"]

    def status(run_id: str) -> str:
        return Run.objects.get(pk=run_id).status

    # A run that will wait for an approval, followed from the start by an event
    # stream, which the web process feeds by polling (no LISTEN) through PgBouncer.
    approval = submit("approve_then_act", {"log": log})
    stream = Stream(f"{web.base}/api/runs/{approval}/events", api_key)
    stream.start()
    wait_until(lambda: stream.seen or stream.error, what="the stream to start")
    assert stream.error is None, stream.error
    workers = [
        processes.worker(
            *WORKER_ARGS, DATABASE_URL=pgbouncer.url("workers"), RUNS_DB_POOL_MIN="4", **pooled
        )
        for _ in range(2)
    ]
    wait_until(
        lambda: Worker.objects.filter(stopped_at__isnull=True).count() == 2,
        what="both workers to register",
    )

    # Multi-step runs, claimed and checkpointed by both workers.
    batch = [submit("steps", {"steps": 4, "log": log, "step_seconds": 0.01}) for _ in range(20)]
    wait_until(
        lambda: Run.objects.filter(pk__in=batch, status="done").count() == len(batch),
        timeout=60,
        what="the multi-step runs to finish",
    )
    wait_until(lambda: status(approval) == "waiting_human", what="the run to wait for its approval")
    # Every worker connection is a PgBouncer client; fewer server connections serve them all.
    clients = [c for c in pgbouncer.admin("SHOW CLIENTS") if c["database"] == "workers"]
    assert len(clients) > POOL_SIZE, clients
    assert {c["application_name"] for c in clients} == {"agentruns runworker"}

    answer = httpx.post(
        f"{web.base}/api/runs/{approval}/approve",
        json={"comment": "go"},
        headers=bearer(api_key),
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    wait_until(lambda: status(approval) == "done", what="the approved run to finish")
    stream.join(20)
    assert not stream.is_alive(), "the event stream did not close at the run's end"
    assert stream.error is None and stream.status == 200, (stream.error, stream.status)
    types = [e.event for e in stream.seen]
    assert {"approval.requested", "run.approved"} <= set(types) and types[-1] == "run.done", types

    # A worker is SIGKILLed inside step 2 of a run; the reaper gives the run to the other worker.
    block = tmp_path / "block"
    block.touch()
    doomed = submit("steps", {"steps": 3, "log": log, "block_at": 2, "block_file": str(block)})
    started = wait_until(
        lambda: [pid for r, seq, _, pid in executions(log) if r == doomed and seq == 2],
        what="step 2 to start",
    )
    holder = next(proc for proc in workers if proc.pid == started[0])
    survivor = next(proc for proc in workers if proc is not holder)
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    block.unlink()
    wait_until(
        lambda: Run.objects.get(pk=doomed).locked_until < timezone.now(),
        timeout=10,
        what="the dead worker's lease to expire",
    )
    reaped = processes.run("reap", "--once", DATABASE_URL=pgbouncer.url("reaper"), **pooled)
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr
    wait_until(
        lambda: status(doomed) == "done",
        timeout=20,
        what="the other worker to finish the rescued run",
    )

    survivor.send_signal(signal.SIGTERM)
    assert survivor.wait(30) == 0, processes.output(survivor)
    web.stop()
    for proc in (web.proc, *workers):  # nothing failed along the way, not even a retried read
        assert "Traceback" not in processes.output(proc), processes.output(proc)

    # Each step ran once; only the step the killed worker was inside ran again, on the other worker.
    counts = Counter((run_id, seq) for run_id, seq, _, _ in executions(log))
    expected = {(run_id, seq): 1 for run_id in batch for seq in (1, 2, 3, 4)}
    expected |= {(approval, 1): 1, (approval, 3): 1, (doomed, 1): 1, (doomed, 2): 2, (doomed, 3): 1}
    assert counts == expected
    assert {pid for r, seq, _, pid in executions(log) if r == doomed and seq == 3} == {survivor.pid}
    assert all(pid in {holder.pid, survivor.pid} for _, _, _, pid in executions(log))
    rescued = Run.objects.get(pk=doomed)
    assert (rescued.attempt, rescued.steps_done) == (2, 3)
    assert Run.objects.get(pk=approval).result["applied"] is True
    assert Tenant.objects.get(pk=tenant.pk).running == 0
    # The web process, the workers and the reaper each did their work through PgBouncer.
    stats = {row["database"]: row for row in pgbouncer.admin("SHOW STATS")}
    assert all(stats[alias]["total_xact_count"] > 0 for alias in ALIASES), stats
    assert "ERROR" not in pgbouncer.log() and "WARNING" not in pgbouncer.log(), pgbouncer.log()


def test_connections_of_their_own_prepare_statements_only_when_django_does(pgbouncer, monkeypatch):
    """The event hub's pool and the LISTEN connection (``connection_kwargs``) follow RUNS_DB_PREPARE.

    Were they to fall back to psycopg's own default (prepare after 5
    executions), a web process behind PgBouncer would fail to read Events
    ("prepared statement "_pg3_0" does not exist") and its streams would lag.
    """
    options = connections["default"].settings_dict["OPTIONS"]
    # What RUNS_LISTEN=0 leaves in the settings: no startup options (PgBouncer refuses them) ...
    monkeypatch.delitem(options, "options", raising=False)
    if (
        not pgbouncer.max_prepared_statements
    ):  # ... and, with RUNS_DB_PREPARE=0, no prepare threshold
        monkeypatch.delitem(options, "prepare_threshold", raising=False)
    through_pgbouncer = {"host": "127.0.0.1", "port": pgbouncer.port, "dbname": "web"}
    # Open transactions side by side, so that PgBouncer has several server connections to rotate through.
    others = [psycopg.connect(**connection_kwargs() | through_pgbouncer) for _ in range(POOL_SIZE)]
    try:
        for other in others:
            other.execute("BEGIN")
            other.execute("SELECT 1")
        for other in others:
            other.execute("COMMIT")
        servers = [s for s in pgbouncer.admin("SHOW SERVERS") if s["database"] == "web"]
        assert len(servers) == POOL_SIZE, servers
        reader = others[0]
        for n in range(
            4 * POOL_SIZE + 6
        ):  # past psycopg's default threshold on every server connection
            assert reader.execute("SELECT %s::int + 1", [n]).fetchone() == (n + 1,)
    finally:
        for other in others:
            other.close()


# Django's .iterator() in autocommit declares a WITH HOLD cursor and fetches
# from it statement by statement. Two server connections handed out in turn
# put the fetch on the one that never saw the cursor, unless settings turn
# server-side cursors off.
ITERATE = """
import json, os
import psycopg
from django.db import connection
from runs.models import Tenant

others = [psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) for _ in range(2)]
for other in others:
    other.execute("BEGIN")
    other.execute("SELECT 1")
for other in others:
    other.execute("COMMIT")
slugs = [tenant.slug for tenant in Tenant.objects.order_by("slug").iterator(chunk_size=2)]
print(json.dumps({"slugs": slugs, "prepare_threshold": connection.settings_dict["OPTIONS"].get("prepare_threshold")}))
"""


def test_runs_listen_0_alone_turns_off_what_pgbouncer_cannot_keep(pgbouncer, processes):
    """RUNS_LISTEN=0 (the switch for a transaction-pooling proxy) also turns off WITH HOLD cursors and,
    unless RUNS_DB_PREPARE says otherwise, prepared statements."""
    tenants = sorted(TenantFactory().slug for _ in range(7))
    env = {"RUNS_LISTEN": "0", "RUNS_DB_PREPARE": "1" if pgbouncer.max_prepared_statements else ""}
    result = processes.run("shell", "-c", ITERATE, DATABASE_URL=pgbouncer.url("web"), **env)
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["slugs"] == tenants
    assert answer["prepare_threshold"] == (2 if pgbouncer.max_prepared_statements else None)
