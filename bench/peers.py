"""This project's engine side by side with Procrastinate, PGQueuer and django-tasks-db.

    .venv/bin/python bench/peers.py                       # default sizes, 3 repetitions (about 20 minutes on 2 cores)
    .venv/bin/python bench/peers.py --quick --no-write    # smoke test, prints only
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/peers.py --out docs/benchmarks.md

Without DATABASE_URL the embedded PostgreSQL is started (config.dbserver);
with it, that server is used, its durability settings untouched. Every
system gets a fresh database of its own (``bench_<pid>`` for this project,
``bench_<pid>_<peer>`` for the peers), its schema applied its own documented
way, and every bench database is dropped at the end, also on failure or
SIGTERM/SIGINT. Every system runs 2 worker processes (separate OS
processes, started the system's documented way) with the same concurrency
where it has the notion, and the same no-op job bodies
(bench/peer_procrastinate.py, bench/peer_pgqueuer.py, bench/peer_djtasks.py,
the ``bench_steps`` and ``bench_ping`` kinds of bench/agents.py).

Measurements, each repeated ``--repeat`` times, round-robin over the systems
(the order rotates each repetition), medians reported:

1. Drain, 1-step: ``--jobs`` jobs enqueued first (untimed), then the 2 workers
   started; rate = N / (time the done count reached N - time it first moved
   above 0), polled every 20 ms on the bench's own connection. Then the
   workers are stopped and every job is verified finished once, successfully.
2. Drain, 3-step: this project only (runs of three checkpointed no-op steps).
3. Dispatch latency: 2 idle workers; ``--dispatch-jobs`` jobs submitted one at
   a time through the system's Python submit path, each waited for (its body
   sends a UDP datagram to the submitting process); p50/p95/p99.
4. Enqueue rate: ``--enqueue-jobs`` jobs submitted one by one, a commit each,
   no workers running; jobs/s, the count checked in the database.

The submit side runs in a process of its own for every system
(bench/peer_client.py). Writes ``--out`` (default docs/benchmarks.md) and a
PNG chart beside it (same name, .png), and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    BENCH_SECRET_KEY,
    Children,
    Database,
    drop_database,
    pct,
    say,
    with_database,
)

PY = sys.executable
BIN = Path(PY).parent
MANAGE = str(ROOT / "manage.py")
SYSTEMS = ["agentruns", "agentruns-tasks", "procrastinate", "pgqueuer", "django-tasks-db"]
LABELS = {
    "agentruns": "agentruns (this project)",
    "agentruns-tasks": "agentruns django.tasks backend",
    "agentruns-baseline": "agentruns baseline (--baseline)",
    "procrastinate": "Procrastinate",
    "pgqueuer": "PGQueuer",
    "django-tasks-db": "django-tasks-db",
}
PACKAGES = {
    "procrastinate": "procrastinate",
    "pgqueuer": "pgqueuer",
    "django-tasks-db": "django-tasks-db",
}
POLL = 0.02  # seconds between the drain's done-count queries
ORIGINAL_DATABASE_URL = os.environ.get(
    "DATABASE_URL", ""
)  # for the command printed in the document


def package_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def connect(url: str):
    import psycopg

    return psycopg.connect(url, autocommit=True)


def scalar(conn, query: str, params=None):
    return conn.execute(query, params).fetchone()[0]


# The systems.
class System:
    name = ""
    steps_supported = (1,)
    root = ROOT  # the checkout whose code runs (another one for agentruns-baseline)
    listens = True  # ready = 2 backends that issued LISTEN; otherwise 2 connected backends

    def __init__(self, bench: Bench):
        self.bench = bench
        self.args = bench.args
        self.db_name = f"bench_{os.getpid()}_{self.name.replace('-', '_')}"
        self.created = False

    @property
    def label(self) -> str:
        return LABELS[self.name]

    @property
    def version(self) -> str:
        return package_version(PACKAGES[self.name])

    def create(self) -> None:
        with connect(self.bench.base_url) as conn:
            conn.execute(f'CREATE DATABASE "{self.db_name}"')
        self.created = True
        self.url = with_database(self.bench.base_url, self.db_name)
        self.apply_schema()

    def drop(self) -> None:
        if self.created:
            self.bench.drop(self.db_name)
            self.created = False

    def env(self) -> dict:
        env = dict(self.bench.base_env)
        env["BENCH_PEER_DSN"] = self.url
        return env

    def run_checked(self, argv: list[str], env: dict, what: str) -> None:
        out = subprocess.run(
            argv, cwd=self.root, env=env, capture_output=True, text=True, timeout=300
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"{self.label}: {what} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}"
            )

    def ready(self, conn) -> bool:
        if self.listens:
            return (
                scalar(
                    conn,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND query ILIKE 'LISTEN%%'",
                )
                >= self.args.workers
            )
        return (
            scalar(
                conn,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND backend_type = 'client backend'",
            )
            >= self.args.workers
        )

    # Overridden: apply_schema, worker_argv, clear, analyze, done_sql, verify, queued.


class AgentRuns(System):
    name = "agentruns"
    steps_supported = (1, 3)

    @property
    def version(self) -> str:
        return f"{self.bench.git['head']} ({'dirty' if self.bench.git['dirty'] else 'clean'})"

    def create(self) -> None:
        # bench/common.Database: a fresh bench_<pid>, Django set up in this process and migrated.
        self.database = Database(agent_modules="bench.agents")
        self.created = True
        self.database.setup()
        self.db_name = self.database.name
        self.url = os.environ["DATABASE_URL"]
        from runs.tenants import ensure_tenant

        ensure_tenant(slug="bench-peers", max_running=1000, max_queued=10_000_000)

    def drop(self) -> None:
        if self.created:
            self.database.drop()
            self.created = False

    def env(self) -> dict:
        env = dict(self.bench.base_env)
        env.update(
            {
                "DATABASE_URL": self.url,
                "AGENT_MODULES": "bench.agents",
                "DJANGO_SETTINGS_MODULE": "config.settings",
                "DEBUG": "0",
                "SECRET_KEY": BENCH_SECRET_KEY,
                "LOG_LEVEL": "WARNING",
                "BENCH_TENANT": "bench-peers",
            }
        )
        return env

    def worker_argv(self, purpose: str) -> list[str]:
        queue = "bench_ping" if purpose == "dispatch" else "bench_tp"
        return [
            PY,
            str(self.root / "manage.py"),
            "runworker",
            "--queues",
            queue,
            "--concurrency",
            str(self.args.concurrency),
        ]

    def clear(self, conn) -> None:
        conn.execute("TRUNCATE runs_run CASCADE")
        counters = [
            c
            for (c,) in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'runs_tenant' "
                "AND column_name IN ('running', 'queued')"
            ).fetchall()
        ]
        if counters:
            conn.execute(
                "UPDATE runs_tenant SET " + ", ".join(f"{c} = 0" for c in sorted(counters))
            )

    def analyze(self, conn) -> None:
        conn.execute("ANALYZE runs_run")
        conn.execute("ANALYZE runs_tenant")

    done_sql = "SELECT count(*) FROM runs_run WHERE status = 'done'"

    def verify(self, conn, n: int, steps: int) -> tuple[bool, str]:
        total = scalar(conn, "SELECT count(*) FROM runs_run")
        complete = scalar(
            conn,
            "SELECT count(*) FROM runs_run WHERE status = 'done' AND steps_done = %s "
            "AND attempt = 1",
            [steps],
        )
        step_rows = scalar(conn, "SELECT count(*) FROM runs_step WHERE status = 'done'")
        has_running = scalar(
            conn,
            "SELECT count(*) FROM information_schema.columns WHERE table_name = 'runs_tenant' "
            "AND column_name = 'running'",
        )
        running = (
            scalar(conn, "SELECT coalesce(sum(running), 0) FROM runs_tenant") if has_running else 0
        )
        ok = total == n and complete == n and step_rows == n * steps and running == 0
        return ok, (
            f"runs {total}, done with steps_done={steps} and attempt=1: {complete}/{n}, "
            f"runs_step rows done {step_rows}/{n * steps}, tenant running counters left {running}"
        )

    def queued(self, conn) -> int:
        return scalar(conn, "SELECT count(*) FROM runs_run WHERE status = 'queued'")


class AgentRunsTasks(AgentRuns):
    """This project's django.tasks backend (runs.tasks) running bench/peer_djtasks.py's @task functions.

    The very module django-tasks-db runs: under config.settings its ``@task``
    decorators take this project's backend, under bench.peer_settings
    django-tasks-db's. Each task is a one-step run, checkpointed.
    """

    name = "agentruns-tasks"
    steps_supported = (1,)
    kind = "bench.peer_djtasks.noop"

    def create(self) -> None:
        # Django is set up once per process, on one bench database: shared with the agentruns system
        # when both are measured (their measurements run one after the other, each on cleared tables).
        shared = next((x for x in self.bench.systems if type(x) is AgentRuns and x.created), None)
        if shared is None:
            super().create()
        else:
            self.db_name, self.url = shared.db_name, shared.url
        from runs.tenants import ensure_tenant

        ensure_tenant(slug="bench-tasks", max_running=1000, max_queued=10_000_000)

    def drop(self) -> None:
        if getattr(self, "database", None) is not None:
            super().drop()

    def env(self) -> dict:
        env = super().env()
        env.update(
            {"AGENT_MODULES": "bench.agents,bench.peer_djtasks", "RUNS_TASK_TENANT": "bench-tasks"}
        )
        return env

    def worker_argv(self, purpose: str) -> list[str]:
        return [
            PY,
            MANAGE,
            "runworker",
            "--queues",
            "default",
            "--concurrency",
            str(self.args.concurrency),
        ]


class Procrastinate(System):
    name = "procrastinate"

    def apply_schema(self) -> None:
        self.run_checked(
            [str(BIN / "procrastinate"), "--app=bench.peer_procrastinate.app", "schema", "--apply"],
            self.env(),
            "procrastinate schema --apply",
        )

    def env(self) -> dict:
        env = super().env()
        # A pool of concurrency + 1: no job waits for a connection (LISTEN has one of its own).
        env["BENCH_POOL_SIZE"] = str(self.args.concurrency + 1)
        return env

    def worker_argv(self, purpose: str) -> list[str]:
        return [
            str(BIN / "procrastinate"),
            "--app=bench.peer_procrastinate.app",
            "--log-level=warning",
            "worker",
            "--queues",
            "bench",
            "--concurrency",
            str(self.args.concurrency),
        ]

    def clear(self, conn) -> None:
        conn.execute(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers, "
            "procrastinate_workers CASCADE"
        )

    def analyze(self, conn) -> None:
        conn.execute("ANALYZE procrastinate_jobs")

    done_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"

    def verify(self, conn, n: int, steps: int) -> tuple[bool, str]:
        total = scalar(conn, "SELECT count(*) FROM procrastinate_jobs")
        succeeded = scalar(
            conn,
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' AND attempts = 1",
        )
        started = scalar(conn, "SELECT count(*) FROM procrastinate_events WHERE type = 'started'")
        ok = total == n and succeeded == n and started == n
        return (
            ok,
            f"jobs {total}, succeeded with attempts=1: {succeeded}/{n}, 'started' events {started}/{n}",
        )

    def queued(self, conn) -> int:
        return scalar(conn, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")


class PGQueuer(System):
    name = "pgqueuer"
    listens = False  # its one connection LISTENs, then dequeues: its last query is not the LISTEN

    @property
    def batch_size(self) -> int:
        return max(1, self.args.concurrency // 2)

    @property
    def max_tasks(self) -> int:
        # pgqueuer requires max_concurrent_tasks >= 2 * batch_size.
        return max(self.args.concurrency, 2 * self.batch_size)

    def env(self) -> dict:
        env = super().env()
        env["BENCH_PGQUEUER_DRIVER"] = self.args.pgqueuer_driver
        return env

    def apply_schema(self) -> None:
        self.run_checked(
            [str(BIN / "pgq"), "--pg-dsn", self.url, "install"], self.env(), "pgq install"
        )

    def worker_argv(self, purpose: str) -> list[str]:
        return [
            PY,
            "-m",
            "bench.peer_pgqueuer",
            "--batch-size",
            str(self.batch_size),
            "--max-concurrent-tasks",
            str(self.max_tasks),
            "--log-level",
            "WARNING",
        ]

    def clear(self, conn) -> None:
        conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")

    def analyze(self, conn) -> None:
        conn.execute("ANALYZE pgqueuer")

    done_sql = "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"

    def verify(self, conn, n: int, steps: int) -> tuple[bool, str]:
        left = scalar(conn, "SELECT count(*) FROM pgqueuer")
        counts = dict(
            conn.execute("SELECT status::text, count(*) FROM pgqueuer_log GROUP BY 1").fetchall()
        )
        jobs = scalar(conn, "SELECT count(DISTINCT job_id) FROM pgqueuer_log")
        bad = {k: v for k, v in counts.items() if k not in ("queued", "picked", "successful")}
        ok = (
            left == 0
            and jobs == n
            and counts.get("queued") == n
            and counts.get("picked") == n
            and counts.get("successful") == n
            and not bad
        )
        return ok, (
            f"queue table rows left {left}, log: {jobs} jobs, queued {counts.get('queued', 0)}, "
            f"picked {counts.get('picked', 0)}, successful {counts.get('successful', 0)}/{n}"
            + (f", other {bad}" if bad else "")
        )

    def queued(self, conn) -> int:
        return scalar(conn, "SELECT count(*) FROM pgqueuer WHERE status = 'queued'")


class DjangoTasksDB(System):
    name = "django-tasks-db"
    listens = False  # no LISTEN/NOTIFY: db_worker polls
    table = "django_tasks_database_dbtaskresult"

    def env(self) -> dict:
        env = dict(self.bench.base_env)
        env.update(
            {
                "DATABASE_URL": self.url,
                "DJANGO_SETTINGS_MODULE": "bench.peer_settings",
                "SECRET_KEY": BENCH_SECRET_KEY,
            }
        )
        return env

    def apply_schema(self) -> None:
        self.run_checked([PY, "-m", "django", "migrate", "--verbosity", "0"], self.env(), "migrate")

    def worker_argv(self, purpose: str) -> list[str]:
        return [
            PY,
            "-m",
            "django",
            "db_worker",
            "--queue-name",
            "default",
            "--interval",
            str(self.args.dtdb_interval),
            "--no-startup-delay",
            "--verbosity",
            "0",
        ]

    def clear(self, conn) -> None:
        conn.execute(f"TRUNCATE {self.table}")

    def analyze(self, conn) -> None:
        conn.execute(f"ANALYZE {self.table}")

    @property
    def done_sql(self) -> str:
        return f"SELECT count(*) FROM {self.table} WHERE status = 'SUCCESSFUL'"

    def verify(self, conn, n: int, steps: int) -> tuple[bool, str]:
        total = scalar(conn, f"SELECT count(*) FROM {self.table}")
        ok_rows = scalar(
            conn,
            f"SELECT count(*) FROM {self.table} WHERE status = 'SUCCESSFUL' "
            "AND jsonb_array_length(worker_ids) = 1",
        )
        ok = total == n and ok_rows == n
        return ok, f"results {total}, SUCCESSFUL claimed by one worker once: {ok_rows}/{n}"

    def queued(self, conn) -> int:
        return scalar(conn, f"SELECT count(*) FROM {self.table} WHERE status = 'READY'")


class AgentRunsBaseline(AgentRuns):
    """This project as another checkout has it (``--baseline DIR``): its migrations, worker and client.

    For a change's before and after side by side in one run: the same
    bench, machine, PostgreSQL server and Python environment, the other
    checkout's code (``git worktree add --detach DIR <commit>``). Its own
    database, migrated by its own ``manage.py migrate``.
    """

    name = "agentruns-baseline"

    def __init__(self, bench: Bench):
        super().__init__(bench)
        self.root = Path(bench.args.baseline).resolve()

    @property
    def version(self) -> str:
        head = subprocess.run(
            ["git", "-C", str(self.root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return f"{head or '?'} ({self.root})"

    def create(self) -> None:
        with connect(self.bench.base_url) as conn:
            conn.execute(f'CREATE DATABASE "{self.db_name}"')
        self.created = True
        self.url = with_database(self.bench.base_url, self.db_name)
        manage = [PY, str(self.root / "manage.py")]
        self.run_checked([*manage, "migrate", "--noinput"], self.env(), "migrate")
        self.run_checked(
            [
                *manage,
                "shell",
                "-c",
                "from runs.tenants import ensure_tenant; "
                "ensure_tenant(slug='bench-peers', max_running=1000, max_queued=10_000_000)",
            ],
            self.env(),
            "the bench tenant",
        )

    def drop(self) -> None:
        System.drop(self)

    def env(self) -> dict:
        env = super().env()
        env["PYTHONPATH"] = str(self.root) + os.pathsep + env.get("PYTHONPATH", "")
        return env


CLASSES = {
    c.name: c
    for c in (AgentRuns, AgentRunsTasks, AgentRunsBaseline, Procrastinate, PGQueuer, DjangoTasksDB)
}


# The bench.
class Bench:
    def __init__(self, args):
        self.args = args
        self.systems: list[System] = []
        self.results: dict[str, dict[str, list[dict]]] = {}

    def setup(self) -> None:
        self.base_env = os.environ.copy()  # before bench/common.Database changes os.environ
        from config.dbserver import ensure_database_url

        self.base_url = ensure_database_url()
        self.base_env["DATABASE_URL"] = self.base_url
        self.base_env["PYTHONUNBUFFERED"] = "1"
        self.base_env["PYTHONPATH"] = str(ROOT) + os.pathsep + self.base_env.get("PYTHONPATH", "")
        self.base_env.pop("DJANGO_SETTINGS_MODULE", None)
        self.git = git_state()
        self.machine = machine_info(self.base_url)
        self.logdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
        self.children = Children(self.logdir)
        for name in self.args.systems:
            system = CLASSES[name](self)
            self.systems.append(system)
            self.results[name] = {}
            say(f"[setup] {system.label}: database and schema ...")
            system.create()
            say(f"[setup] {system.label}: {system.db_name} ready")

    def drop(self, name: str) -> None:
        from django.conf import settings

        if settings.configured:
            drop_database(self.base_url, name)
        else:
            with connect(self.base_url) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def teardown(self) -> None:
        if getattr(self, "children", None) is not None:
            self.children.stop()
        for system in self.systems:
            try:
                system.drop()
            except Exception as exc:  # every database is tried
                say(f"could not drop database {system.db_name}: {exc}")

    def record(self, system: System, key: str, value: dict) -> None:
        self.results[system.name].setdefault(key, []).append(value)

    def client(self, system: System, op: str, *extra: str, timeout: float) -> dict:
        client = str(system.root / "bench" / "peer_client.py")
        # The baseline's client submits the baseline's way, as the system it is.
        peer = "agentruns" if system.name == "agentruns-baseline" else system.name
        proc = self.children.start(
            f"{system.name}-client-{op}",
            [PY, client, peer, op, *extra],
            system.env(),
            cwd=system.root,
        )
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.children.stop([proc], grace=2)
            raise RuntimeError(
                f"{system.label}: client {op} timed out after {timeout:.0f} s"
            ) from None
        text = Path(proc.log_path).read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"{system.label}: client {op} failed ({proc.returncode}):\n{self.children.tail(proc)}"
            )
        return json.loads(lines[-1][len("RESULT ") :])

    def start_workers(self, system: System, purpose: str) -> list[subprocess.Popen]:
        return [
            self.children.start(
                f"{system.name}-{purpose}-worker-{i}",
                system.worker_argv(purpose),
                system.env(),
                cwd=system.root,
            )
            for i in range(self.args.workers)
        ]

    def check_alive(self, system: System, workers) -> None:
        for w in workers:
            if w.poll() is not None:
                raise RuntimeError(
                    f"{system.label}: worker exited ({w.returncode}):\n{self.children.tail(w)}"
                )

    # 1 and 2: drains.
    def drain(self, system: System, steps: int) -> None:
        n = self.args.jobs
        key = f"drain{steps}"
        with connect(system.url) as conn:
            system.clear(conn)
            self.client(
                system, "bulk", "--n", str(n), "--steps", str(steps), timeout=max(300, n / 10)
            )
            system.analyze(conn)
            started = time.perf_counter()
            workers = self.start_workers(system, key)
            first = done = None
            limit = max(120.0, n / 20)
            count = 0
            try:
                while True:
                    count = scalar(conn, system.done_sql)
                    now = time.perf_counter()
                    if count > 0 and first is None:
                        first = now
                    if count >= n:
                        done = now
                        break
                    if now - started > limit:
                        break
                    self.check_alive(system, workers)
                    time.sleep(POLL)
            finally:
                self.children.stop(workers)
            ok, detail = system.verify(conn, n, steps)
        timed_out = done is None
        if timed_out:
            ok = False
            detail += f"; TIMED OUT after {limit:.0f} s at {count}/{n} done"
        seconds = (done - first) if (done and first and done > first) else float("nan")
        rate = n / seconds if ok and seconds == seconds else None
        self.record(
            system,
            key,
            {
                "ok": ok,
                "rate": rate,
                "seconds": seconds,
                "detail": detail,
                "startup": (first - started) if first else None,
            },
        )
        what = (
            f"{rate:,.0f} {'jobs' if steps == 1 else 'runs'}/s over {seconds:.2f} s"
            if rate
            else "FAILED"
        )
        say(
            f"[drain {steps}-step] {system.label:<26} {what:<28} verify: {detail} -> {'OK' if ok else 'FAILED'}"
        )
        if not ok:
            for w in workers:
                say(f"  --- {w.bench_name} log tail ---\n{self.children.tail(w)}")

    # 3: dispatch latency.
    def dispatch(self, system: System) -> None:
        args = self.args
        with connect(system.url) as conn:
            system.clear(conn)
            started = time.monotonic()
            workers = self.start_workers(system, "dispatch")
            try:
                deadline = started + 60
                while not system.ready(conn):
                    self.check_alive(system, workers)
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{system.label}: workers not ready within 60 s")
                    time.sleep(0.05)
                time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))  # at least 3 s after start
                self.check_alive(system, workers)
                total = args.dispatch_jobs + args.dispatch_warmup
                res = self.client(
                    system,
                    "dispatch",
                    "--n",
                    str(args.dispatch_jobs),
                    "--warmup",
                    str(args.dispatch_warmup),
                    "--pause",
                    str(args.dispatch_pause),
                    timeout=60 + total * 11,
                )
            finally:
                self.children.stop(workers)
            ok, detail = system.verify(conn, total, 1)
        lat = res["latencies_ms"]
        lost = res["lost"] + res["warmup_lost"]
        ok = ok and lost == 0 and bool(lat)
        value = {"ok": ok, "detail": detail + f"; datagrams not received: {lost}", "latencies": lat}
        if lat:
            value.update(
                {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99), "max": max(lat)}
            )
        if res.get("submit_ms"):
            value["submit_p50"] = pct(res["submit_ms"], 50)
        self.record(system, "dispatch", value)
        what = (
            f"p50 {value['p50']:.2f}  p95 {value['p95']:.2f}  p99 {value['p99']:.2f} ms"
            if ok
            else "FAILED"
        )
        say(
            f"[dispatch]     {system.label:<26} {what:<38} verify: {value['detail']} -> {'OK' if ok else 'FAILED'}"
        )

    # 4: enqueue rate.
    def enqueue(self, system: System) -> None:
        n, warmup = self.args.enqueue_jobs, self.args.enqueue_warmup
        with connect(system.url) as conn:
            system.clear(conn)
            res = self.client(
                system, "enqueue", "--n", str(n), "--warmup", str(warmup), timeout=max(300, n / 5)
            )
            count = system.queued(conn)
            system.clear(conn)
        ok = count == n + warmup
        value = {
            "ok": ok,
            "rate": res["rate"] if ok else None,
            "seconds": res["seconds"],
            "p50": res["p50_ms"],
            "p99": res["p99_ms"],
            "detail": f"jobs waiting in the database {count}/{n + warmup} ({warmup} warm-up)",
        }
        self.record(system, "enqueue", value)
        what = f"{res['rate']:,.0f} jobs/s (submit p50 {res['p50_ms']:.2f} ms)" if ok else "FAILED"
        say(
            f"[enqueue]      {system.label:<26} {what:<38} verify: {value['detail']} -> {'OK' if ok else 'FAILED'}"
        )

    def run(self) -> None:
        args = self.args
        for rep in range(args.repeat):
            k = rep % len(self.systems)
            order = self.systems[k:] + self.systems[:k]
            say()
            say(
                f"=== repetition {rep + 1}/{args.repeat}: order {', '.join(s.name for s in order)}  "
                f"(load average {load_text()})"
            )
            for system in order:
                self.guarded(system, "drain1", self.drain, system, 1)
            for system in order:
                if 3 in system.steps_supported:
                    self.guarded(system, "drain3", self.drain, system, 3)
            for system in order:
                self.guarded(system, "dispatch", self.dispatch, system)
            for system in order:
                self.guarded(system, "enqueue", self.enqueue, system)

    def guarded(self, system: System, key: str, fn, *args) -> None:
        """One measurement; an error in it is that measurement's FAILED, the bench goes on."""
        try:
            fn(*args)
        except Exception as exc:
            detail = f"error: {exc}".strip()
            say(f"[{key}] {system.label}: FAILED, {detail}")
            self.record(system, key, {"ok": False, "detail": detail.splitlines()[0][:300]})


# Summaries.
def median(values: list[float]) -> float:
    return statistics.median(values)


def summary(bench: Bench) -> dict:
    """Per system and measurement: the median and the individual values, or FAILED."""
    out: dict = {}
    for name, per in bench.results.items():
        out[name] = {}
        for key, values in per.items():
            failed = [v for v in values if not v["ok"]]
            entry: dict = {
                "failed": bool(failed),
                "details": [v["detail"] for v in failed],
                "n": len(values),
            }
            if key == "dispatch":
                for q in ("p50", "p95", "p99", "submit_p50"):
                    entry[q + "_values"] = [v.get(q) for v in values]
                    present = [x for x in entry[q + "_values"] if x is not None]
                    if not failed and present:
                        entry[q] = median(present)
            else:
                entry["values"] = [v.get("rate") for v in values]
                if not failed:
                    entry["median"] = median([v["rate"] for v in values])
            out[name][key] = entry
    return out


def fmt_rate(entry: dict | None) -> str:
    if entry is None:
        return "—"
    if entry["failed"]:
        return "**FAILED**"
    return f"{entry['median']:,.0f}"


def fmt_ms(x: float) -> str:
    return f"{x:,.1f}" if x >= 100 else f"{x:.2f}"


def fmt_dispatch(entry: dict | None) -> str:
    if entry is None:
        return "—"
    if entry["failed"]:
        return "**FAILED**"
    return " / ".join(fmt_ms(entry[q]) for q in ("p50", "p95", "p99"))


def ratio(a: dict | None, b: dict | None, key: str = "median") -> str:
    if not a or not b or a["failed"] or b["failed"] or not b.get(key):
        return "—"
    return f"{a[key] / b[key]:.2f}×"


def results_table(bench: Bench, s: dict) -> list[str]:
    lines = [
        "| system | drain, 1-step (jobs/s) | drain, 3-step (runs/s) | dispatch p50 / p95 / p99 (ms) | enqueue (jobs/s) |",
        "|---|--:|--:|--:|--:|",
    ]
    for system in bench.systems:
        e = s[system.name]
        if 3 in system.steps_supported:
            three = fmt_rate(e.get("drain3"))
        else:
            one = e.get("drain1")
            three = (
                f"no steps (1-step: {fmt_rate(one)})" if one and not one["failed"] else "no steps"
            )
        lines.append(
            f"| {system.label} | {fmt_rate(e.get('drain1'))} | {three} | {fmt_dispatch(e.get('dispatch'))} "
            f"| {fmt_rate(e.get('enqueue'))} |"
        )
    return lines


def ratio_lines(bench: Bench, s: dict) -> list[str]:
    names = [x.name for x in bench.systems]
    if "procrastinate" not in names:
        return ["(Procrastinate was not measured: no ratios.)"]
    p = s["procrastinate"]
    lines = [
        "| system | drain 1-step ÷ Procrastinate 1-step | drain 3-step ÷ Procrastinate 1-step "
        "| dispatch p50 ÷ Procrastinate p50 | enqueue ÷ Procrastinate |",
        "|---|--:|--:|--:|--:|",
    ]
    for system in bench.systems:
        if system.name == "procrastinate":
            continue
        e = s[system.name]
        three = ratio(e.get("drain3"), p.get("drain1")) if 3 in system.steps_supported else "—"
        lines.append(
            f"| {system.label} | {ratio(e.get('drain1'), p.get('drain1'))} | {three} "
            f"| {ratio(e.get('dispatch'), p.get('dispatch'), 'p50')} "
            f"| {ratio(e.get('enqueue'), p.get('enqueue'))} |"
        )
    return lines


def values_lines(bench: Bench, s: dict) -> list[str]:
    def rates(values):
        return ", ".join("FAILED" if v is None else f"{v:,.0f}" for v in values)

    lines = ["| measurement | system | each repetition | median |", "|---|---|---|--:|"]
    names = {
        "drain1": "drain, 1-step (jobs/s)",
        "drain3": "drain, 3-step (runs/s)",
        "enqueue": "enqueue (jobs/s)",
    }
    for key in ("drain1", "drain3", "dispatch", "enqueue"):
        for system in bench.systems:
            e = s[system.name].get(key)
            if e is None:
                continue
            if key == "dispatch":
                for q in ("p50", "p95", "p99", "submit_p50"):
                    vals = ", ".join("FAILED" if v is None else fmt_ms(v) for v in e[q + "_values"])
                    what = (
                        "dispatch: the submit call itself, p50 (ms)"
                        if q == "submit_p50"
                        else f"dispatch {q} (ms)"
                    )
                    shown = "FAILED" if e["failed"] else fmt_ms(e[q]) if q in e else "—"
                    lines.append(f"| {what} | {system.label} | {vals} | {shown} |")
            else:
                lines.append(
                    f"| {names[key]} | {system.label} | {rates(e['values'])} | {fmt_rate(e)} |"
                )
    return lines


def failures(bench: Bench) -> list[str]:
    out = []
    for system in bench.systems:
        for key, values in bench.results[system.name].items():
            for i, v in enumerate(values):
                if not v["ok"]:
                    out.append(f"- {system.label}, {key}, repetition {i + 1}: {v['detail']}")
    return out


# The machine and the code.
def git_state() -> dict:
    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    head = git("rev-parse", "--short", "HEAD").strip() or "(not a git checkout)"
    changed = [line[3:] for line in git("status", "--porcelain").splitlines() if line.strip()]
    return {"head": head, "dirty": bool(changed), "changed": changed}


def machine_info(base_url: str) -> dict:
    info = {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "cpu": platform.processor() or "?",
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                info["ram"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        info["ram"] = "?"
    os_name = platform.system()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    except OSError:
        pass
    info["os"] = f"{os_name}, kernel {platform.release()}"
    with connect(base_url) as conn:
        info["pg"] = scalar(conn, "SHOW server_version")
        info["pg_full"] = scalar(conn, "SELECT version()")
        for name in ("fsync", "synchronous_commit", "shared_buffers", "max_connections"):
            info[name] = scalar(conn, f"SHOW {name}")
    return info


def load_text() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def command_text() -> str:
    argv = [
        os.path.relpath(PY, ROOT) if PY.startswith(str(ROOT)) else PY,
        os.path.relpath(os.path.abspath(sys.argv[0]), ROOT),
        *sys.argv[1:],
    ]
    prefix = ""
    url = ORIGINAL_DATABASE_URL
    if url:
        from urllib.parse import urlsplit, urlunsplit

        parts = urlsplit(url)
        if parts.password:
            parts = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@"))
        prefix = f"DATABASE_URL={urlunsplit(parts)} "
    return prefix + shlex.join(argv)


# The chart.
def chart(bench: Bench, s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator

    systems = bench.systems
    labels = [
        x.label.replace(" (this project)", "\n(this project)").replace(
            " django.tasks backend", "\ndjango.tasks\nbackend"
        )
        for x in systems
    ]
    fig, axes = plt.subplots(1, 3, figsize=(17, 5.8), gridspec_kw={"width_ratios": [1.25, 1, 1.45]})
    colors = {
        "1": "#4C72B0",
        "3": "#DD8452",
        "enq": "#55A868",
        "p50": "#4C72B0",
        "p95": "#8172B3",
        "p99": "#C44E52",
    }

    def bar_labels(ax, bars, texts, fontsize=8):
        for bar, text in zip(bars, texts, strict=True):
            if text is None:
                continue
            height = bar.get_height()
            ax.annotate(
                text,
                (bar.get_x() + bar.get_width() / 2, height),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=fontsize,
            )

    def short_ms(v: float) -> str:
        return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"

    def failed_mark(ax, x, y=0):
        ax.annotate(
            "FAILED",
            (x, y),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=8,
            color="#C44E52",
            fontweight="bold",
        )

    x = list(range(len(systems)))
    # Drain.
    ax = axes[0]
    width = 0.38
    one = [s[x_.name].get("drain1") for x_ in systems]
    three = [s[x_.name].get("drain3") for x_ in systems]
    v1 = [e["median"] if e and not e["failed"] else 0 for e in one]
    v3 = [e["median"] if e and not e["failed"] else 0 for e in three]
    b1 = ax.bar([i - width / 2 for i in x], v1, width, label="1-step jobs", color=colors["1"])
    b3 = ax.bar(
        [i + width / 2 for i in x],
        v3,
        width,
        label="3-step runs (this project only)",
        color=colors["3"],
    )
    bar_labels(ax, b1, [f"{v:,.0f}" if v else None for v in v1])
    bar_labels(ax, b3, [f"{v:,.0f}" if v else None for v in v3])
    for i, system in enumerate(systems):
        if 3 not in system.steps_supported:
            ax.annotate(
                "no steps",
                (i + width / 2, 0),
                xytext=(0, 4),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=7,
                color="#888888",
                rotation=90,
                style="italic",
            )
    for i, e in enumerate(one):
        if e and e["failed"]:
            failed_mark(ax, i - width / 2)
    for i, e in enumerate(three):
        if e and e["failed"]:
            failed_mark(ax, i + width / 2)
    ax.set_title("Drain throughput (higher is better)")
    ax.set_ylabel("jobs (runs) finished per second")
    ax.set_xticks(x, labels, fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, max(v1 + v3 + [1]) * 1.18)
    ax.grid(axis="y", alpha=0.3)
    # Dispatch.
    ax = axes[2]
    width = 0.26
    disp = [s[x_.name].get("dispatch") for x_ in systems]
    top = 1.0
    for j, q in enumerate(("p50", "p95", "p99")):
        vals = [e[q] if e and not e["failed"] else 0 for e in disp]
        top = max(top, *vals)
        bars = ax.bar([i + (j - 1) * width for i in x], vals, width, label=q, color=colors[q])
        bar_labels(ax, bars, [short_ms(v) if v else None for v in vals], fontsize=7)
    ax.set_yscale("log")
    bottom = min([e["p50"] for e in disp if e and not e["failed"]] or [2.0]) / 2
    ax.set_ylim(bottom=bottom, top=top * 3)
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    for i, e in enumerate(disp):
        if e and e["failed"]:
            failed_mark(ax, i, bottom)
    ax.set_title("Dispatch latency, submit → job body started (lower is better)")
    ax.set_ylabel("milliseconds (log scale)")
    ax.set_xticks(x, labels, fontsize=9)
    ax.legend(fontsize=8, loc="upper left", ncols=3)
    ax.grid(axis="y", alpha=0.3, which="both")
    # Enqueue.
    ax = axes[1]
    enq = [s[x_.name].get("enqueue") for x_ in systems]
    ve = [e["median"] if e and not e["failed"] else 0 for e in enq]
    be = ax.bar(x, ve, 0.55, label="one job per commit, 1 thread", color=colors["enq"])
    bar_labels(ax, be, [f"{v:,.0f}" if v else None for v in ve])
    for i, e in enumerate(enq):
        if e and e["failed"]:
            failed_mark(ax, i)
    ax.set_title("Enqueue rate (higher is better)")
    ax.set_ylabel("jobs submitted per second")
    ax.set_xticks(x, labels, fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, max(ve + [1]) * 1.18)
    ax.grid(axis="y", alpha=0.3)
    args = bench.args
    m = bench.machine
    fig.suptitle(
        f"Medians of {args.repeat} repetition{'s' if args.repeat > 1 else ''}: 2 worker processes per "
        f"system, concurrency {args.concurrency}, {args.jobs:,} drain jobs, {args.dispatch_jobs} dispatch "
        f"probes, {args.enqueue_jobs:,} enqueues\n{m['cores']} × {m['cpu']}, PostgreSQL {m['pg']} "
        f"(fsync {m['fsync']}, synchronous_commit {m['synchronous_commit']}), same server for all",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# The document.
def document(
    bench: Bench, s: dict, *, png_name: str | None, wall: float, load0: str, load1: str
) -> str:
    args, m, g = bench.args, bench.machine, bench.git
    g1 = getattr(bench, "git_end", g)
    names = [x.name for x in bench.systems]
    today = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    L: list[str] = []
    L += [
        "# Benchmarks: this project next to Procrastinate, PGQueuer and django-tasks-db",
        "",
        f"_Generated by `bench/peers.py` on {today}; do not edit by hand, re-run the command below._",
        "",
    ]
    if png_name:
        L += [f"![Drain throughput, enqueue rate and dispatch latency per system]({png_name})", ""]
    L += [
        f"Medians of {args.repeat} repetition{'s' if args.repeat > 1 else ''} (the individual values are listed "
        "below). Same PostgreSQL server for every system, its durability settings untouched, 2 worker "
        f"processes per system, concurrency {args.concurrency} where a system has the notion, no-op job bodies.",
        "",
    ]
    L += results_table(bench, s)
    L += [
        "",
        "- **drain, 1-step**: jobs finished per second while 2 workers drain "
        f"{args.jobs:,} jobs enqueued beforehand: N ÷ (time the done count reached N − time it first moved above "
        "0), the count polled every 20 ms on the bench's own connection, so worker start-up is left out the same "
        "way for every system. Then every job is checked in the database: finished exactly once, successfully.",
        "- **drain, 3-step**: the same for this project's runs of three checkpointed no-op steps (a checkpoint "
        "is a committed step row and progress update, what makes a run resumable after a crash). The peers "
        "have no steps: their 1-step figure is repeated next to it for the ratio.",
        f"- **dispatch**: {args.dispatch_jobs} jobs submitted one at a time (after {args.dispatch_warmup} "
        "warm-up jobs) to 2 idle workers, through each system's Python submit path; latency = when the bench "
        "received the UDP datagram the job body sends − just before the submit call (so it includes the "
        f"submit's own commit: its p50 is listed with the repetitions below). {args.dispatch_pause * 1000:.0f} ms "
        "pause after each job, so the workers are idle every time. p50 / p95 / p99 in milliseconds; lower is "
        "better.",
        f"- **enqueue**: {args.enqueue_jobs:,} jobs submitted one by one from one thread through the same "
        f"submit path, each in its own transaction (as a web request would), no worker running (after "
        f"{args.enqueue_warmup} warm-up submits); the count is checked in the database.",
        "",
    ]
    L += [
        "### Ratios to Procrastinate",
        "",
        *ratio_lines(bench, s),
        "",
        "Throughput ratios above 1 mean faster than Procrastinate; a dispatch ratio below 1 means a shorter "
        "latency.",
        "",
    ]
    fail = failures(bench)
    if fail:
        L += [
            "### Verification failures",
            "",
            "A measurement whose verification failed in any repetition is "
            "shown as FAILED, without a figure:",
            "",
            *fail,
            "",
        ]
    L += ["### Every repetition", "", *values_lines(bench, s), ""]
    L += [
        "## How each system was run",
        "",
        "Each system has a database of its own on the server, its schema applied its own documented way, and "
        "its jobs cleared between measurements. Each worker is a separate OS process started the system's "
        "documented way; the submit side runs in a separate process too (`bench/peer_client.py`), with the same "
        "timing loop for every system. Job bodies: the drain job does nothing; the dispatch job sends one UDP "
        "datagram (`bench/peer_ping.py`).",
        "",
        "| system | version | schema | worker (2 processes) | concurrency setting | connections | wake-up | submit path |",
        "|---|---|---|---|---|---|---|---|",
    ]
    C = args.concurrency
    rows = {
        "agentruns": (
            f"commit {g['head']}{', dirty tree' if g['dirty'] else ''}",
            "`manage.py migrate`",
            f"`manage.py runworker --queues bench_tp --concurrency {C}` (drain; `bench_ping` for dispatch)",
            f"`--concurrency {C}`: runs in flight per process, each in a thread of its pool",
            "Django's psycopg 3 pool + one LISTEN connection",
            "LISTEN/NOTIFY on commit (1 s poll as backstop)",
            "`submit_run(...)` in `transaction.atomic()`",
        ),
        "agentruns-tasks": (
            "the same commit",
            "`manage.py migrate` (the same database as the row above)",
            f"`manage.py runworker --queues default --concurrency {C}`",
            f"`--concurrency {C}`: as above; each task is a one-step run of kind `bench.peer_djtasks.noop`",
            "as above",
            "as above",
            "`task.enqueue(...)` of bench/peer_djtasks.py, the module django-tasks-db runs (autocommit)",
        ),
        "procrastinate": (
            package_version("procrastinate"),
            "`procrastinate schema --apply`",
            f"`procrastinate --app=bench.peer_procrastinate.app --log-level=warning worker --queues bench "
            f"--concurrency {C}`",
            f"`--concurrency {C}`: async jobs in flight per process (one fetch per job); `async def` tasks",
            f"`PsycopgConnector`, psycopg 3 async pool of {C + 1} + one LISTEN connection",
            "LISTEN/NOTIFY on (default), 5 s poll",
            "`task.defer(...)` (sync connector)",
        ),
        "pgqueuer": (
            package_version("pgqueuer"),
            "`pgq install` (durable: all tables logged)",
            f"`python -m bench.peer_pgqueuer --batch-size {max(1, C // 2)} --max-concurrent-tasks "
            f"{max(C, 2 * max(1, C // 2))}` (= `pgq run bench.peer_pgqueuer:main` with those options, see below)",
            f"`--max-concurrent-tasks {max(C, 2 * max(1, C // 2))}`: jobs held per process (it must be at least "
            f"twice `--batch-size`, the jobs dequeued per statement); completions are written in batches",
            (
                "one asyncpg connection (`AsyncpgDriver`, the driver `pgq` tries first)"
                if args.pgqueuer_driver == "asyncpg"
                else "one psycopg 3 `AsyncConnection` (`PsycopgDriver`)"
            ),
            "LISTEN/NOTIFY (always on)",
            f"`Queries({'AsyncpgDriver' if args.pgqueuer_driver == 'asyncpg' else 'PsycopgDriver'}(conn))"
            ".enqueue(...)`",
        ),
        "django-tasks-db": (
            package_version("django-tasks-db"),
            "`django-admin migrate` (`bench/peer_settings.py`)",
            f"`python -m django db_worker --queue-name default --interval {args.dtdb_interval:g} "
            "--no-startup-delay --verbosity 0`",
            "none: one task at a time per process (so 2 in flight in all)",
            "Django's psycopg 3 pool",
            f"polling every {args.dtdb_interval:g} s when idle (the default is 1 s); "
            "no LISTEN/NOTIFY",
            "`task.enqueue(...)` (autocommit)",
        ),
    }
    for name in names:
        L.append(f"| {LABELS[name]} | " + " | ".join(rows[name]) + " |")
    L += [
        "",
        "Notes on fairness:",
        "",
        "- The peers' task functions are `async def` where the library is asyncio-based (Procrastinate, "
        "PGQueuer: their native kind; PGQueuer accepts no other), so a no-op job costs them no thread hop; this "
        "project and django-tasks-db run sync functions in threads or in the worker's main thread.",
        "- This project writes more per job: a run row with its lease, a step row per checkpoint, events; the "
        "peers write a job row (and Procrastinate an event row per transition, PGQueuer a log row per "
        "transition).",
        "- PGQueuer runs on asyncpg (`--pgqueuer-driver`), the one connector here that is not psycopg 3: with "
        "its `PsycopgDriver` an idle worker picks a new job up about 1 s late (its NOTIFY watcher holds the "
        "connection in `notifies(timeout=1.0)` and takes it back before the woken dequeue runs: dispatch p50 "
        "≈ 1,010 ms in a trial run), which would measure that wrinkle, not PGQueuer.",
        "- PGQueuer's `pgq run` could not be used as is: with the installed typer its `--log-level` option "
        "reaches `setup_fancy_logger` as a string and the command fails before starting (even without the "
        "option). `bench/peer_pgqueuer.py` does what `pgq run` does after parsing: sets PGQueuer's logger to "
        "WARNING and calls `pgqueuer.run(factory, batch_size=…, max_concurrent_tasks=…)`.",
        "- django-tasks-db has no concurrency setting and no LISTEN/NOTIFY: its drain runs 2 jobs at a time in "
        "all. Its dispatch figure is close to the worst case of polling: a `db_worker` polls again right after "
        "each task and then sleeps the whole interval, and the next probe comes a few ms after the previous one "
        "finished, so both workers have just polled and the probe waits nearly the full interval "
        f"({args.dtdb_interval:g} s; `--dtdb-interval` sets it). Jobs arriving at random times would wait about "
        "a third to a half of the interval on average.",
        "- Logging is at WARNING for every worker (per-job INFO lines would cost the peers that log them).",
        "",
    ]
    L += [
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {m['cpu']}, {m['cores']} cores |",
        f"| RAM | {m.get('ram', '?')} |",
        f"| OS | {m['os']} |",
        f"| PostgreSQL | {m['pg']}: fsync = {m['fsync']}, synchronous_commit = {m['synchronous_commit']}, "
        f"shared_buffers = {m['shared_buffers']}, max_connections = {m['max_connections']} |",
        f"| Python | {m['python']} |",
        "| packages | "
        + ", ".join(
            f"{p} {package_version(p)}"
            for p in (
                "procrastinate",
                "pgqueuer",
                "asyncpg",
                "django-tasks-db",
                "Django",
                "psycopg",
                "psycopg-pool",
                "matplotlib",
            )
        )
        + " |",
        f"| this repository | commit {g['head']}, "
        + (
            f"dirty ({len(g['changed'])} changed or untracked path{'s' if len(g['changed']) != 1 else ''})"
            if g["dirty"]
            else "clean tree"
        )
        + (
            f"; **HEAD moved to {g1['head']} during the run**: the figures of this project may mix code versions"
            if g1["head"] != g["head"]
            else "; the working tree changed during the run"
            if g1["changed"] != g["changed"]
            else ""
        )
        + " |",
        f"| load average (1, 5, 15 min) | before {load0}; after {load1} |",
        f"| bench wall time | {wall / 60:.1f} min |",
        "",
        "The machine may have been shared with other work while measuring: the load average above says how "
        "busy it was; every system was measured in turn within each repetition, so noise spreads over all.",
        "",
    ]
    L += ["## Command", "", "```sh", command_text(), "```", ""]
    return "\n".join(L)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, help="jobs per drain (default 5000, quick 500)")
    parser.add_argument(
        "--repeat", type=int, help="repetitions of every measurement (default 3, quick 1)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=10, help="per worker process, where a system has it (10)"
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="worker processes per system (2; docs/scaling.md: 1-8)",
    )
    parser.add_argument(
        "--dispatch-jobs", type=int, help="measured dispatch probes (default 200, quick 30)"
    )
    parser.add_argument(
        "--enqueue-jobs", type=int, help="measured one-by-one enqueues (default 2000, quick 200)"
    )
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--dtdb-interval",
        type=float,
        default=1.0,
        help="django-tasks-db db_worker --interval, seconds (its default 1)",
    )
    parser.add_argument(
        "--pgqueuer-driver",
        choices=["asyncpg", "psycopg"],
        default="asyncpg",
        help="PGQueuer's driver, worker and client alike (asyncpg, its first choice)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small counts, one repetition (a smoke test)"
    )
    parser.add_argument(
        "--out", default="docs/benchmarks.md", help="markdown to write; the PNG goes beside it"
    )
    parser.add_argument("--no-write", action="store_true", help="print only, write no file")
    parser.add_argument(
        "--baseline",
        metavar="DIR",
        help="also measure this project as the checkout DIR has it (agentruns-baseline), "
        "e.g. a `git worktree add --detach DIR <commit>` of the commit before a change",
    )
    args = parser.parse_args(argv)
    q = args.quick
    args.jobs = args.jobs or (500 if q else 5000)
    args.repeat = args.repeat or (1 if q else 3)
    args.dispatch_jobs = args.dispatch_jobs or (30 if q else 200)
    args.enqueue_jobs = args.enqueue_jobs or (200 if q else 2000)
    args.dispatch_warmup = 3 if q else 10
    args.enqueue_warmup = 20
    args.dispatch_pause = 0.02
    args.systems = [x.strip() for x in args.systems.split(",") if x.strip()]
    if args.baseline:
        if not (Path(args.baseline) / "manage.py").is_file():
            parser.error(f"--baseline: {args.baseline} is not a checkout of this project")
        if "agentruns-baseline" not in args.systems:
            args.systems.insert(1, "agentruns-baseline")
    elif "agentruns-baseline" in args.systems:
        parser.error("--systems: agentruns-baseline needs --baseline DIR")
    unknown = [x for x in args.systems if x not in CLASSES]
    if unknown or not args.systems:
        parser.error(f"--systems: unknown {unknown}; choose from {','.join(CLASSES)}")
    for name in ("jobs", "repeat", "concurrency", "dispatch_jobs", "enqueue_jobs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    # SIGTERM ends the bench through the finally block below, like Ctrl-C (SIGINT).
    signal.signal(signal.SIGTERM, terminate)
    started = time.perf_counter()
    load0 = load_text()
    bench = Bench(args)
    try:
        say(
            f"peers bench: systems {', '.join(args.systems)}; {args.repeat} repetition(s); drain {args.jobs} jobs, "
            f"dispatch {args.dispatch_jobs}, enqueue {args.enqueue_jobs}; concurrency {args.concurrency}; "
            f"load average {load0}"
        )
        bench.setup()
        m = bench.machine
        say(
            f"machine: {m['cores']} x {m['cpu']}, {m.get('ram')}, {m['os']}; PostgreSQL {m['pg']} "
            f"(fsync {m['fsync']}, synchronous_commit {m['synchronous_commit']}, shared_buffers {m['shared_buffers']})"
        )
        say(f"logs: {bench.logdir}")
        bench.run()
        wall = time.perf_counter() - started
        load1 = load_text()
        bench.git_end = git_state()
        if bench.git_end["head"] != bench.git["head"]:
            say(
                f"note: HEAD moved from {bench.git['head']} to {bench.git_end['head']} during the run"
            )
        s = summary(bench)
        (bench.logdir / "results.json").write_text(json.dumps(bench.results, indent=1))
        say()
        say("=" * 100)
        for line in results_table(bench, s):
            say(line)
        say()
        for line in ratio_lines(bench, s):
            say(line)
        for line in failures(bench):
            say(line)
        say("=" * 100)
        say(f"load average before {load0}, after {load1}; bench wall time {wall:.0f} s")
        if not args.no_write:
            out = (ROOT / args.out) if not os.path.isabs(args.out) else Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            png = out.with_suffix(".png")
            chart(bench, s, png)
            out.write_text(
                document(bench, s, png_name=png.name, wall=wall, load0=load0, load1=load1)
            )
            say(f"wrote {out} and {png}")
        return 1 if failures(bench) else 0
    finally:
        bench.teardown()


if __name__ == "__main__":
    sys.exit(main())
