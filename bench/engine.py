"""Engine benchmark: accept latency, dispatch latency, throughput (docs/explanation/performance.md).

    .venv/bin/python bench/engine.py            # full run (a few minutes)
    .venv/bin/python bench/engine.py --quick    # smaller counts
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/engine.py

Without DATABASE_URL the embedded PostgreSQL is started (config.dbserver);
with it, that server is used. Either way the benchmark creates its own
database ``bench_<pid>``, migrates it, and drops it at the end, so it never
touches development data. Every process it starts (serve, runworker) gets
``DATABASE_URL`` of that database and ``AGENT_MODULES=bench.agents`` and is
killed on exit.

Phases (``--phases``):

0. Calibration: commit latency and one-row / many-row update rates of the
   server, the ceilings everything else works under.
1. Accept: ``POST /api/runs`` latency under concurrent keep-alive clients,
   served by `manage.py serve` (uvicorn). The runs go to a queue no worker listens on.
2. Dispatch: submit (commit) to first step started, with two idle
   ``runworker`` processes woken by LISTEN/NOTIFY.
3. Throughput: N queued runs of a k-step no-op kind, drained by two
   ``runworker --burst --concurrency C`` processes; every run is verified
   ``done`` with all its checkpoints; the share of HOT updates of runs_run
   is read from pg_stat_user_tables.

Diagnostics printed with the figures: CPU used by the web server, the workers and
the bench database's backends per request or per run, how busy the whole
machine was, a sampled histogram of pg_stat_activity wait events per engine
statement, and deadlocks / crashed executors found in the worker logs. The
machine is shared: the load average is printed with every phase.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import BENCH_SECRET_KEY, Children, cpu_times, drop_database  # noqa: E402

PY = sys.executable
MANAGE = str(ROOT / "manage.py")

# Targets from the issue, printed next to the figures.
TARGET_ACCEPT_P99_MS = 60.0  # with 16 clients (issue 15)
TARGET_DISPATCH_P50_MS = 10.0


# Small helpers.
def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def say(text: str = "") -> None:
    print(text, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live children, from /proc."""
    hz = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0.0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid, ppid = int(entry), int(fields[1])
        if pid == root or ppid == root:
            total += (float(fields[11]) + float(fields[12])) / hz
    return total


def statement_kind(query: str) -> str:
    """Which engine statement a pg_stat_activity query text is."""
    q = " ".join(query.split())[:400]
    if q.startswith(("WITH tenants AS", "WITH returns AS")):
        return "claim"
    if q.startswith("WITH cur AS"):
        return "exit"
    if q.startswith("WITH r AS ( UPDATE runs_run SET steps_done"):
        return "checkpoint"
    if q.startswith("WITH held AS"):
        return "heartbeat"
    if q.startswith("SELECT seq, name, status, output FROM runs_step"):
        return "step log"
    if "pg_notify" in q:
        return "notify"
    if q.startswith('INSERT INTO "runs_run"'):
        return "insert run"
    if q.startswith('INSERT INTO "runs_event"'):
        return "insert event"
    if q.upper().startswith(("COMMIT", "BEGIN", "SAVEPOINT", "RELEASE")):
        return q.split()[0].upper()
    return q[:40]


class ActivitySampler:
    """Samples pg_stat_activity of the bench database every ``interval`` s on its own connection.

    The histogram of (statement, wait event) over active backends shows
    where the time of a phase goes: CPU (no wait event), WAL flush
    (IO:WALSync / LWLock:WALWrite), or row locks (Lock:transactionid,
    Lock:tuple), and on which statement.
    """

    def __init__(self, url: str, interval: float = 0.01):
        self.url = url
        self.interval = interval
        self.counts: dict[tuple[str, str], int] = {}
        self.lock_tables: dict[str, int] = {}
        self.backend_ticks: dict[int, float] = {}
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            self._backend_cpu(conn)
        self.baseline = dict(self.backend_ticks)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        import psycopg

        last_locks = last_cpu = 0.0
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU (no wait)'), query "
                    "FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
                    "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
                ).fetchall()
                self.samples += 1
                now = time.monotonic()
                if now - last_cpu >= 0.2:
                    last_cpu = now
                    self._backend_cpu(conn)
                lock_waits = 0
                for wait, query in rows:
                    key = (statement_kind(query or ""), wait)
                    self.counts[key] = self.counts.get(key, 0) + 1
                    lock_waits += wait.startswith("Lock:")
                now = time.monotonic()
                if lock_waits and now - last_locks >= 0.05:
                    # Which table the row-lock waits are on: a waiter on a
                    # transaction holds (or waits for) the tuple lock of the row.
                    last_locks = now
                    for (relation,) in conn.execute(
                        "SELECT (SELECT t.relation::regclass::text FROM pg_locks t "
                        "        WHERE t.pid = a.pid AND t.locktype = 'tuple' LIMIT 1) "
                        "FROM pg_stat_activity a WHERE a.datname = current_database() "
                        "AND a.wait_event_type = 'Lock' AND a.pid <> pg_backend_pid()"
                    ).fetchall():
                        relation = relation or "(no tuple lock held: a transaction wait)"
                        self.lock_tables[relation] = self.lock_tables.get(relation, 0) + 1
                self._stop.wait(self.interval)
            self._backend_cpu(conn)

    def _backend_cpu(self, conn) -> None:
        """CPU seconds of the bench database's backends (from /proc; the last reading before each exits)."""
        pids = [
            pid
            for (pid,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchall()
        ]
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            ticks = float(fields[11]) + float(fields[12])  # utime, stime
            self.backend_ticks[pid] = max(self.backend_ticks.get(pid, 0.0), ticks)

    def backend_cpu_seconds(self, baseline: dict[int, float] | None = None) -> float:
        baseline = baseline or {}
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        return sum(t - baseline.get(pid, 0.0) for pid, t in self.backend_ticks.items()) / hz

    def report(self, indent: str = "  ", top: int = 12) -> list[str]:
        total = sum(self.counts.values())
        if not total or not self.samples:
            return [f"{indent}(no active backends sampled)"]
        lines = [
            f"{indent}{self.samples} samples of pg_stat_activity, on average "
            f"{total / self.samples:.1f} active backends; share of backend time by statement and wait:"
        ]
        for (kind, wait), n in sorted(self.counts.items(), key=lambda kv: -kv[1])[:top]:
            lines.append(f"{indent}  {n / total * 100:5.1f}%  {kind:<12} {wait}")
        locked = sum(self.lock_tables.values())
        if locked:
            lines.append(
                f"{indent}row-lock waits by table (sampled): "
                + ", ".join(
                    f"{rel} {n / locked * 100:.0f}%"
                    for rel, n in sorted(self.lock_tables.items(), key=lambda kv: -kv[1])
                )
            )
        return lines


# The benchmark.
class Bench:
    def __init__(self, args):
        self.args = args
        self.results: dict = {}

    # Setup.
    def setup_database(self) -> None:
        was_set = bool(os.environ.get("DATABASE_URL"))
        from config.dbserver import ensure_database_url

        base_url = ensure_database_url()
        if was_set:
            parts = urlsplit(base_url)
            shown = (
                parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
                if parts.password
                else parts
            )
            self.server_label = f"DATABASE_URL ({urlunsplit(shown)})"
        else:
            self.server_label = "embedded PostgreSQL (.data/pg, started or joined by this bench)"
        self.base_url = base_url
        import psycopg

        self.db_name = f"bench_{os.getpid()}"
        with psycopg.connect(base_url, autocommit=True) as conn:
            self.pg_version = conn.execute("SELECT version()").fetchone()[0]
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('synchronous_commit', 'fsync', 'shared_buffers', 'max_connections', 'wal_level')"
                ).fetchall()
            )
            conn.execute(f'CREATE DATABASE "{self.db_name}"')
        self.db_created = True
        self.pg_settings = settings
        self.url = with_database(base_url, self.db_name)
        os.environ["DATABASE_URL"] = self.url
        os.environ["AGENT_MODULES"] = "bench.agents"
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        # Settings refuse to start without a key when DEBUG is off, and the bench
        # measures with DEBUG off, as production runs: a throwaway key, this machine only.
        os.environ.setdefault("SECRET_KEY", BENCH_SECRET_KEY)
        # The server serves plain HTTP on loopback here, as behind a proxy that
        # terminates TLS: no redirect to https.
        os.environ.setdefault("SECURE_SSL_REDIRECT", "0")

        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)

        self.env = os.environ.copy()
        self.env["PYTHONUNBUFFERED"] = "1"
        self.env["PYTHONPATH"] = str(ROOT) + os.pathsep + self.env.get("PYTHONPATH", "")

    def drop_database(self) -> None:
        if not getattr(self, "db_created", False):
            return
        drop_database(self.base_url, self.db_name)
        self.db_created = False

    def tenant(self, slug: str, max_running: int = 1000):
        from runs.tenants import ensure_tenant

        tenant, _ = ensure_tenant(slug=slug, max_running=max_running, max_queued=10_000_000)
        return tenant

    @staticmethod
    def code_version() -> str:
        """The commit measured, and engine files that differ from it in the working tree."""
        try:
            head = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--", "config", "runs", "workers"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.split("\n")
        except (OSError, subprocess.SubprocessError):
            return os.environ.get("BENCH_CODE_VERSION", "(not a git checkout)")
        if not head:
            return os.environ.get("BENCH_CODE_VERSION", "(not a git checkout)")
        changed = [line[3:] for line in dirty if line.strip()]
        return f"commit {head}" + (
            f", with uncommitted changes in {', '.join(changed)}" if changed else ", clean"
        )

    @staticmethod
    def load() -> str:
        one, five, fifteen = os.getloadavg()
        return f"load average {one:.2f} {five:.2f} {fifteen:.2f}"

    def sql(self, query: str, params=None) -> list[tuple]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(query, params or [])
            return cursor.fetchall() if cursor.description else []

    def header(self) -> None:
        say("=" * 78)
        say("agentruns engine benchmark")
        say("=" * 78)
        say(f"server     : {self.server_label}")
        say(f"PostgreSQL : {self.pg_version}")
        say("settings   : " + ", ".join(f"{k}={v}" for k, v in sorted(self.pg_settings.items())))
        say(f"database   : {self.db_name} (created for this run, dropped at the end)")
        say(f"machine    : {os.cpu_count()} CPUs, Python {sys.version.split()[0]}")
        say(f"code       : {ROOT} {self.code_version()}")
        mode = "quick" if self.args.quick else "full"
        say(f"mode       : {mode}")
        say(f"load       : {self.load()} (other processes on this machine skew every figure below)")

    # Phase 0: what this machine's PostgreSQL can do at all.
    def phase_calibrate(self) -> None:
        """Commit latency and row-update rates on a scratch table: the ceilings the engine works under."""
        import psycopg

        say()
        say("-" * 78)
        say(
            "0. CALIBRATION: commit latency and update rates of this server (scratch table, autocommit)"
        )
        say("-" * 78)
        seconds = 1.5 if self.args.quick else 3.0
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE bench_counter (id int PRIMARY KEY, n bigint NOT NULL DEFAULT 0)"
            )
            conn.execute("INSERT INTO bench_counter SELECT g, 0 FROM generate_series(0, 63) g")
            lat = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                t0 = time.perf_counter()
                conn.execute("UPDATE bench_counter SET n = n + 1 WHERE id = 0")
                lat.append((time.perf_counter() - t0) * 1000)
        say(
            f"[calibrate] one-row UPDATE + COMMIT, 1 client: p50 {pct(lat, 50):.2f} ms, p99 {pct(lat, 99):.2f} ms "
            f"({len(lat) / seconds:.0f}/s)"
        )

        def hammer(clients: int, same_row: bool) -> float:
            counts = [0] * clients
            stop = threading.Event()

            def loop(i: int) -> None:
                with psycopg.connect(self.url, autocommit=True) as c:
                    row = 0 if same_row else i + 1
                    while not stop.is_set():
                        c.execute("UPDATE bench_counter SET n = n + 1 WHERE id = %s", [row])
                        counts[i] += 1

            threads = [
                threading.Thread(target=loop, args=(i,), daemon=True) for i in range(clients)
            ]
            for t in threads:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in threads:
                t.join(30)
            return sum(counts) / seconds

        hot = hammer(10, True)
        spread = hammer(10, False)
        say(
            f"[calibrate] 10 clients updating ONE row: {hot:.0f} updates/s (each holds the row lock through its commit)"
        )
        say(f"[calibrate] 10 clients, one row each   : {spread:.0f} updates/s (group commit)")
        say(
            f"[calibrate] a run updates its tenant's row twice (claim, exit): one busy tenant is capped near "
            f"{hot / 2:.0f} runs/s on this server"
        )
        self.results["calibrate"] = {"hot": hot, "spread": spread, "commit_p50": pct(lat, 50)}
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("DROP TABLE bench_counter")

    # Phase 1: accept latency.
    def phase_accept(self, children: Children) -> None:
        from runs.keys import create_api_key

        args = self.args
        tenant = self.tenant("bench-accept")
        secret = create_api_key(tenant=tenant, name="bench").secret
        port = free_port()
        # The production web server (deploy/agentruns-web.service): uvicorn processes.
        argv = [PY, MANAGE, "serve", f"127.0.0.1:{port}", "--workers", str(args.web_workers)]
        say()
        say("-" * 78)
        say("1. ACCEPT: POST /api/runs latency (manage.py serve + Django + PostgreSQL)")
        say("-" * 78)
        say(
            f"server     : manage.py serve --workers {args.web_workers} (uvicorn, one process per core; keep-alive on)"
        )
        say("runs go to queue 'bench_accept'; no worker runs during this phase")
        say(f"({self.load()} at the start of the phase)")
        proc = children.start("serve", argv)
        self._wait_http(port, proc, children)
        sent = 0

        body = json.dumps({"kind": "bench_noop", "input": {"n": 1}}).encode()
        headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
        for clients in args.clients:
            total = args.posts if clients > 1 else max(200, args.posts // 5)
            with ActivitySampler(self.url) as sampler:
                res = self._http_load(
                    port,
                    body,
                    headers,
                    clients=clients,
                    total=total,
                    warmup=args.warmup,
                    cpu_of=proc.pid,
                )
            sent += len(res["latencies"]) + res["warmup"]
            ok = res["status"].get(202, 0)
            lat = res["latencies"]
            label = f"{clients} client{'s' if clients > 1 else ''}"
            say(
                f"[accept, {label}] {len(lat)} requests (after {res['warmup']} warm-up), "
                f"{ok} answered 202, others {dict((k, v) for k, v in res['status'].items() if k != 202) or 'none'}"
            )
            if ok < len(lat):
                # A redirect or an error answers faster than a submit: such figures measure nothing.
                say(
                    f"[accept, {label}] NOT VALID: only {ok} of {len(lat)} measured requests submitted a run"
                )
                self.results[f"accept_{clients}"] = {"invalid": True}
            elif lat:
                p50, p90, p99 = pct(lat, 50), pct(lat, 90), pct(lat, 99)
                verdict = "meets" if p99 < TARGET_ACCEPT_P99_MS else "MISSES"
                say(
                    f"[accept, {label}] p50 {p50:.2f} ms   p90 {p90:.2f} ms   p99 {p99:.2f} ms   "
                    f"max {max(lat):.2f} ms   {res['rps']:.0f} requests/s   "
                    f"(target p99 < {TARGET_ACCEPT_P99_MS:.0f} ms: {verdict})"
                )
                say(
                    f"[accept, {label}] server CPU {res['cpu_ms']:.2f} ms per request; the whole machine was "
                    f"{res['busy']:.0f}% busy while measuring"
                )
                if clients > 1:
                    for line in sampler.report(indent="    ", top=8):
                        say(line)
                self.results[f"accept_{clients}"] = {"p50": p50, "p99": p99, "rps": res["rps"]}
        count = self.sql("SELECT count(*) FROM runs_run WHERE tenant_id = %s", [tenant.id])[0][0]
        children.stop([proc])
        say(f"[accept] runs stored for the tenant: {count} (requests sent: {sent})")

    def _wait_http(self, port: int, proc, children: Children, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited ({proc.returncode}):\n{children.tail(proc)}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                conn.request("GET", "/api/health")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the server did not answer within {timeout}s:\n{children.tail(proc)}")

    def _http_load(
        self, port, body, headers, *, clients: int, total: int, warmup: int, cpu_of: int
    ) -> dict:
        per_client = [total // clients + (1 if i < total % clients else 0) for i in range(clients)]
        latencies: list[list[float]] = [[] for _ in range(clients)]
        statuses: list[dict] = [{} for _ in range(clients)]
        errors: list[str] = []
        barrier = threading.Barrier(clients + 1, timeout=120)
        stop_at = time.monotonic() + self.args.phase_timeout

        def client(i: int) -> None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            try:
                for _ in range(warmup):
                    conn.request("POST", "/api/runs", body, headers)
                    conn.getresponse().read()
                barrier.wait()
                mine, codes = latencies[i], statuses[i]
                for _ in range(per_client[i]):
                    if time.monotonic() > stop_at:
                        break
                    t0 = time.perf_counter()
                    conn.request("POST", "/api/runs", body, headers)
                    resp = conn.getresponse()
                    resp.read()
                    mine.append((time.perf_counter() - t0) * 1000)
                    codes[resp.status] = codes.get(resp.status, 0) + 1
            except Exception as exc:  # reported below
                errors.append(f"client {i}: {exc!r}")
                try:
                    barrier.abort()
                except Exception:
                    pass
            finally:
                conn.close()

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        cpu0, sys0 = tree_cpu_seconds(cpu_of), cpu_times()
        for t in threads:
            t.join(self.args.phase_timeout + 30)
        elapsed = time.perf_counter() - t0
        cpu1, sys1 = tree_cpu_seconds(cpu_of), cpu_times()
        if errors:
            say("client errors: " + "; ".join(errors[:5]))
        merged = [x for lat in latencies for x in lat]
        status: dict = {}
        for codes in statuses:
            for k, v in codes.items():
                status[k] = status.get(k, 0) + v
        return {
            "latencies": merged,
            "status": status,
            "rps": len(merged) / elapsed if elapsed else 0.0,
            "warmup": warmup * clients,
            "cpu_ms": (cpu1 - cpu0) / max(len(merged), 1) * 1000,
            "busy": (sys1[0] - sys0[0]) / max(sys1[1] - sys0[1], 1) * 100,
        }

    # Phase 2: dispatch latency.
    def phase_dispatch(self, children: Children) -> None:
        from django.db import transaction

        from runs.services import submit_run

        args = self.args
        say()
        say("-" * 78)
        say("2. DISPATCH: submit commit -> first step started, 2 idle workers (LISTEN/NOTIFY)")
        say("-" * 78)
        say(f"({self.load()} at the start of the phase)")
        tenant = self.tenant("bench-dispatch")
        workers = [
            children.start(
                f"dispatch-worker-{i}", [PY, MANAGE, "runworker", "--queues", "bench_dispatch"]
            )
            for i in range(2)
        ]
        # Ready = both listener connections have issued LISTEN.
        deadline = time.monotonic() + 60
        while True:
            listening = self.sql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%%'"
            )[0][0]
            if listening >= 2:
                break
            for w in workers:
                if w.poll() is not None:
                    raise RuntimeError(f"worker exited ({w.returncode}):\n{children.tail(w)}")
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start listening within 60 s")
            time.sleep(0.1)
        time.sleep(0.5)

        committed: dict = {}
        lost = 0

        def submit_one(i: int, record: bool) -> None:
            nonlocal lost
            marks: list[float] = []
            with transaction.atomic():
                # Registered before submit_run's own NOTIFY hook, so it runs
                # first, right after COMMIT returned.
                transaction.on_commit(lambda: marks.append(time.time()))
                run = submit_run(
                    tenant=tenant, kind="bench_probe", input={"i": i}, queue="bench_dispatch"
                )
            if record:
                committed[run.id] = marks[0]
            time.sleep(args.dispatch_pause)
            # The run is done before the next submit, so the workers are idle again.
            wait_until = time.monotonic() + 10
            while time.monotonic() < wait_until:
                if self.sql("SELECT status FROM runs_run WHERE id = %s", [run.id])[0][0] == "done":
                    return
                time.sleep(0.002)
            lost += 1

        stop_at = time.monotonic() + args.phase_timeout
        for i in range(args.dispatch_warmup):
            submit_one(-1 - i, record=False)
        for i in range(args.dispatch):
            if time.monotonic() > stop_at:
                say(f"[dispatch] phase time limit reached after {i} runs")
                break
            submit_one(i, record=True)
        children.stop(workers)

        rows = self.sql(
            """
            SELECT r.id, s.output, EXTRACT(EPOCH FROM r.claimed_at)::float8, r.status
            FROM runs_run r LEFT JOIN runs_step s ON s.run_id = r.id AND s.seq = 1
            WHERE r.id = ANY(%s)
            """,
            [list(committed)],
        )
        total, to_claim, claim_to_step = [], [], []
        missing = 0
        from runs.db import loads

        for run_id, output, claimed_at, _status in rows:
            if output is None:
                missing += 1
                continue
            started = loads(output)["t"]
            commit = committed[run_id]
            total.append((started - commit) * 1000)
            if claimed_at is not None:
                to_claim.append((claimed_at - commit) * 1000)
                claim_to_step.append((started - claimed_at) * 1000)
        say(
            f"[dispatch] {len(total)} runs measured (after {args.dispatch_warmup} warm-up), one at a time, "
            f"{args.dispatch_pause * 1000:.0f} ms pause; not finished: {missing + lost}"
        )
        if total:
            p50, p99 = pct(total, 50), pct(total, 99)
            verdict = "meets" if p50 < TARGET_DISPATCH_P50_MS else "MISSES"
            say(
                f"[dispatch] submit->first step: p50 {p50:.2f} ms   p90 {pct(total, 90):.2f} ms   "
                f"p99 {p99:.2f} ms   max {max(total):.2f} ms   (target p50 < {TARGET_DISPATCH_P50_MS:.0f} ms: {verdict})"
            )
            say(
                f"[dispatch]   of which commit->claim statement start: p50 {pct(to_claim, 50):.2f} ms, "
                f"p99 {pct(to_claim, 99):.2f} ms; claim->first step: p50 {pct(claim_to_step, 50):.2f} ms, "
                f"p99 {pct(claim_to_step, 99):.2f} ms"
            )
            self.results["dispatch"] = {"p50": p50, "p99": p99}

    # Phase 3: throughput.
    def phase_throughput(self, children: Children) -> None:
        say()
        say("-" * 78)
        say("3. THROUGHPUT: no-op runs drained by 2 `runworker --burst` processes")
        say("-" * 78)
        say(
            "each configuration starts from an empty runs table (TRUNCATE), enqueues with submit_run"
        )
        say(
            "in one transaction, then ANALYZE, then starts the two workers; wall time includes their start-up"
        )
        for steps, concurrency, tenants in self.args.configs:
            self.throughput_once(children, steps=steps, concurrency=concurrency, tenants=tenants)

    def _stats(self) -> tuple[int, int]:
        time.sleep(1.1)  # backends flush their counters at most once a second (and on exit)
        self.sql("SELECT pg_stat_clear_snapshot()")
        row = self.sql(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs_run'"
        )
        return row[0] if row else (0, 0)

    def throughput_once(
        self, children: Children, *, steps: int, concurrency: int, tenants: int
    ) -> None:
        from django.db import transaction

        from runs.services import submit_run

        n = self.args.runs
        label = f"{steps}-step runs, 2 workers x concurrency {concurrency}, {tenants} tenant{'s' if tenants > 1 else ''}"
        self.sql("TRUNCATE runs_run CASCADE")
        counters = {
            c
            for (c,) in self.sql(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs_tenant' "
                "AND column_name IN ('running', 'queued')"
            )
        }
        if counters:
            self.sql("UPDATE runs_tenant SET " + ", ".join(f"{c} = 0" for c in sorted(counters)))
        tenant_objs = [self.tenant(f"bench-tp-{i}") for i in range(tenants)]
        t0 = time.perf_counter()
        with transaction.atomic():
            for i in range(n):
                submit_run(
                    tenant=tenant_objs[i % tenants],
                    kind="bench_steps",
                    input={"steps": steps},
                    queue="bench_tp",
                )
        enqueue_s = time.perf_counter() - t0
        self.sql("ANALYZE runs_run")
        self.sql("ANALYZE runs_tenant")
        upd0, hot0 = self._stats()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)

        sampler = ActivitySampler(self.url).__enter__()
        sys0 = cpu_times()
        t0 = time.perf_counter()
        workers = [
            children.start(
                f"tp-c{concurrency}-s{steps}-t{tenants}-{i}",
                [
                    PY,
                    MANAGE,
                    "runworker",
                    "--burst",
                    "--queues",
                    "bench_tp",
                    "--concurrency",
                    str(concurrency),
                ],
            )
            for i in range(2)
        ]
        limit = max(self.args.phase_timeout, n / 40)
        timed_out = False
        for w in workers:
            try:
                w.wait(max(0.1, limit - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                timed_out = True
        wall = time.perf_counter() - t0
        sys1 = cpu_times()
        sampler.__exit__(None, None, None)
        if timed_out:
            children.stop(workers)
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        upd1, hot1 = self._stats()

        status = dict(self.sql("SELECT status, count(*) FROM runs_run GROUP BY status"))
        complete = self.sql(
            "SELECT count(*) FROM runs_run WHERE status = 'done' AND steps_done = %s AND attempt = 1",
            [steps],
        )[0][0]
        step_rows = self.sql("SELECT count(*) FROM runs_step WHERE status = 'done'")[0][0]
        first, last = self.sql(
            "SELECT EXTRACT(EPOCH FROM min(started_at))::float8, EXTRACT(EPOCH FROM max(finished_at))::float8 FROM runs_run"
        )[0]
        running_left = self.sql("SELECT coalesce(sum(running), 0) FROM runs_tenant")[0][0]
        active = (last - first) if first and last else float("nan")
        exit_codes = [w.returncode for w in workers]
        ok = complete == n and step_rows == n * steps and running_left == 0 and not timed_out
        say()
        say(f"[throughput: {label}]  ({self.load()} at the end)")
        say(
            f"  enqueue: {n} runs via submit_run in one transaction in {enqueue_s:.2f} s ({n / enqueue_s:.0f} runs/s)"
        )
        say(
            f"  verify : statuses {status}; done with steps_done={steps} and attempt=1: {complete}/{n}; "
            f"step rows done: {step_rows}/{n * steps}; tenant running counters left: {running_left}; "
            f"worker exit codes {exit_codes}{'; TIMED OUT' if timed_out else ''} -> {'OK' if ok else 'FAILED'}"
        )
        if not ok:
            for w in workers:
                say(f"  --- {w.bench_name} log tail ---\n{children.tail(w)}")
        runs_s = n / wall
        if not ok:
            say("  (the rates below are NOT valid: the runs were not all processed)")
        say(
            f"  wall   : {wall:.2f} s from starting the workers to both exiting -> {runs_s:.0f} runs/s, "
            f"{runs_s * steps:.0f} steps/s"
        )
        if active == active:
            say(
                f"  active : {active:.2f} s from the first claim to the last finish (DB clock) -> "
                f"{n / active:.0f} runs/s, {n * steps / active:.0f} steps/s"
            )
        cpu = (cpu1.ru_utime - cpu0.ru_utime, cpu1.ru_stime - cpu0.ru_stime)
        say(
            f"  CPU    : worker processes used {cpu[0]:.1f} s user + {cpu[1]:.1f} s sys "
            f"({(cpu[0] + cpu[1]) / wall * 100:.0f}% of one core over the wall time); the whole machine was "
            f"{(sys1[0] - sys0[0]) / max(sys1[1] - sys0[1], 1) * 100:.0f}% busy (all processes, PostgreSQL included)"
        )
        pg_cpu = sampler.backend_cpu_seconds(sampler.baseline)
        worker_cpu = cpu[0] + cpu[1]
        say(
            f"           PostgreSQL backends of the bench database used {pg_cpu:.1f} s CPU; engine CPU per run: "
            f"{worker_cpu / n * 1000:.2f} ms Python + {pg_cpu / n * 1000:.2f} ms PostgreSQL = "
            f"{(worker_cpu + pg_cpu) / n * 1000:.2f} ms -> CPU-bound ceiling on {os.cpu_count()} cores about "
            f"{os.cpu_count() * n / max(worker_cpu + pg_cpu, 1e-9):.0f} runs/s"
        )
        d_upd, d_hot = upd1 - upd0, hot1 - hot0
        share = d_hot / d_upd * 100 if d_upd else float("nan")
        say(
            f"  HOT    : runs_run updates during the phase {d_upd} ({d_upd / n:.2f} per run), HOT {d_hot} -> "
            f"{share:.1f}% HOT (a claim and the exit change status, which the partial indexes depend on, "
            f"so at most {steps}/{steps + 2} = {steps / (steps + 2) * 100:.0f}% can be HOT)"
        )
        problems = {}
        for w in workers:
            try:
                text = Path(w.log_path).read_text(errors="replace")
            except OSError:
                continue
            for label, needle in (
                ("deadlocks", "OperationalError: deadlock detected"),
                ("executor crashed", "executor crashed"),
                ("claim failed", "claim failed"),
                ("lease lost", "lease lost"),
            ):
                problems[label] = problems.get(label, 0) + text.count(needle)
        say("  errors : in the worker logs: " + ", ".join(f"{k} x{v}" for k, v in problems.items()))
        self.problems = problems
        say("  waits  :")
        for line in sampler.report(indent="    "):
            say(line)
        self.results[f"tp_s{steps}_c{concurrency}_t{tenants}"] = {
            "runs_s": runs_s,
            "active_runs_s": n / active if active == active else None,
            "ok": ok,
            "hot": share,
        }

    def summary(self) -> None:
        say()
        say("=" * 78)
        say("SUMMARY")
        say("=" * 78)
        for key, value in self.results.items():
            if key.startswith("accept_") and value.get("invalid"):
                say(f"accept ({key.split('_')[1]} clients): NOT VALID (see above)")
            elif key.startswith("accept_"):
                say(
                    f"accept ({key.split('_')[1]} clients): p50 {value['p50']:.2f} ms, p99 {value['p99']:.2f} ms, "
                    f"{value['rps']:.0f} req/s   [target p99 < {TARGET_ACCEPT_P99_MS:.0f} ms]"
                )
            elif key == "dispatch":
                say(
                    f"dispatch: p50 {value['p50']:.2f} ms, p99 {value['p99']:.2f} ms   "
                    f"[target p50 < {TARGET_DISPATCH_P50_MS:.0f} ms]"
                )
            elif key == "calibrate":
                say(
                    f"calibration: commit p50 {value['commit_p50']:.2f} ms; one hot row {value['hot']:.0f} updates/s; "
                    f"10 rows {value['spread']:.0f} updates/s"
                )
            else:
                _, s, c, t = key.split("_")
                if not value["ok"]:
                    say(
                        f"throughput {s[1:]}-step, concurrency {c[1:]}, {t[1:]} tenant(s): NOT VERIFIED (see above)"
                    )
                    continue
                active = f"{value['active_runs_s']:.0f}" if value["active_runs_s"] else "?"
                say(
                    f"throughput {s[1:]}-step, concurrency {c[1:]}, {t[1:]} tenant(s): {value['runs_s']:.0f} runs/s wall, "
                    f"{active} runs/s active, HOT {value['hot']:.0f}%, {'verified' if value['ok'] else 'NOT VERIFIED'}   "
                    "[the peers, side by side: bench/peers.py]"
                )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts (about a minute)")
    parser.add_argument(
        "--runs", type=int, help="runs per throughput configuration (default 20000, quick 3000)"
    )
    parser.add_argument(
        "--posts", type=int, help="measured POSTs with concurrent clients (default 3000, quick 800)"
    )
    parser.add_argument(
        "--clients", default="16,1", help="client counts for the accept phase (default 16,1)"
    )
    parser.add_argument(
        "--dispatch", type=int, help="measured dispatch probes (default 300, quick 80)"
    )
    parser.add_argument(
        "--concurrency",
        default=None,
        help="per-worker concurrencies for 3-step runs (default 5,10,20; quick 5)",
    )
    parser.add_argument(
        "--extra",
        default=None,
        help="extra throughput configs steps:concurrency:tenants, comma separated "
        "(default 1:10:1,3:10:10; quick none)",
    )
    parser.add_argument(
        "--web-workers", type=int, default=2, help="manage.py serve processes (default 2)"
    )
    parser.add_argument(
        "--phases", default="calibrate,accept,dispatch,throughput", help="which phases to run"
    )
    parser.add_argument(
        "--phase-timeout", type=float, default=300.0, help="time limit of each phase (s)"
    )
    args = parser.parse_args(argv)
    args.runs = args.runs or (3000 if args.quick else 20000)
    args.posts = args.posts or (800 if args.quick else 3000)
    args.dispatch = args.dispatch or (80 if args.quick else 300)
    args.dispatch_warmup = 10
    args.dispatch_pause = 0.02
    args.warmup = 25
    args.clients = [int(c) for c in args.clients.split(",") if c.strip()]
    concurrency = args.concurrency or ("5" if args.quick else "5,10,20")
    extra = args.extra if args.extra is not None else ("" if args.quick else "1:10:1,3:10:10")
    args.configs = [(3, int(c), 1) for c in concurrency.split(",") if c.strip()]
    for item in extra.split(","):
        if item.strip():
            s, c, t = (int(x) for x in item.split(":"))
            args.configs.append((s, c, t))
    args.phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    for name in ("runs", "posts", "dispatch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    # SIGTERM ends the bench through the finally blocks below, like Ctrl-C.
    signal.signal(signal.SIGTERM, terminate)
    bench = Bench(args)
    logdir = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    children = None
    started = time.perf_counter()
    try:
        bench.setup_database()
        bench.header()
        say(f"logs       : {logdir}")
        children = Children(logdir, bench.env)
        if "calibrate" in args.phases:
            bench.phase_calibrate()
        if "accept" in args.phases:
            bench.phase_accept(children)
        if "dispatch" in args.phases:
            bench.phase_dispatch(children)
        if "throughput" in args.phases:
            bench.phase_throughput(children)
        bench.summary()
        say(f"total bench time {time.perf_counter() - started:.0f} s")
        return 0 if all(v.get("ok", True) for v in bench.results.values()) else 1
    finally:
        if children is not None:
            children.stop()
        try:
            bench.drop_database()
        except Exception as exc:
            say(f"could not drop database {getattr(bench, 'db_name', '?')}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
