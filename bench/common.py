"""What the smaller benchmarks share: a fresh database bench_<pid>, percentiles, raw SQL."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent

BENCH_SECRET_KEY = "bench-insecure-not-a-secret-0123456789abcdefghijklmnop"


def say(text: str = "") -> None:
    print(text, flush=True)


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + name))


class Database:
    """A fresh database bench_<pid> on the server, with Django set up and migrated."""

    def __init__(self, *, agent_modules: str | None = None) -> None:
        self.created = False
        self.agent_modules = agent_modules  # for benches whose runs' kinds must be registered

    def setup(self) -> None:
        self.from_env = bool(os.environ.get("DATABASE_URL"))
        from config.dbserver import ensure_database_url

        self.base_url = ensure_database_url()
        import psycopg

        self.name = f"bench_{os.getpid()}"
        with psycopg.connect(self.base_url, autocommit=True) as conn:
            self.version = conn.execute("SELECT version()").fetchone()[0]
            self.settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN "
                    "('synchronous_commit', 'fsync', 'shared_buffers', 'work_mem', 'random_page_cost')"
                ).fetchall()
            )
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.created = True
        os.environ["DATABASE_URL"] = with_database(self.base_url, self.name)
        if self.agent_modules:
            os.environ["AGENT_MODULES"] = self.agent_modules
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        # Settings refuse to start without a key when DEBUG is off, and the bench
        # measures with DEBUG off, as production runs: a throwaway key, this machine only.
        os.environ.setdefault("SECRET_KEY", BENCH_SECRET_KEY)
        # Plain HTTP on loopback, as the tests: no redirect to https, no secure-only cookies.
        for name in (
            "SECURE_SSL_REDIRECT",
            "SESSION_COOKIE_SECURE",
            "CSRF_COOKIE_SECURE",
            "SECURE_HSTS_SECONDS",
        ):
            os.environ.setdefault(name, "0")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)

    def drop(self) -> None:
        if not self.created:
            return
        drop_database(self.base_url, self.name)
        self.created = False


def sql(query: str, params=None) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(query, params or {})
        return cursor.fetchall() if cursor.description else []


def drop_database(base_url: str, name: str) -> None:
    """Close Django's connections (and pool) to the bench database, then drop it."""
    try:
        from django.db import connections

        for conn in connections.all():
            conn.close()
            if hasattr(conn, "close_pool"):
                conn.close_pool()
    except Exception as exc:  # pragma: no cover - best effort on the way out
        say(f"(closing Django connections: {exc})")
    import psycopg

    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def cpu_times() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat (zeros elsewhere)."""
    try:
        with open("/proc/stat") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)
    return sum(fields) - idle, sum(fields)


class Children:
    """Every subprocess a bench starts, each logging to a file; stop() ends them (TERM, then KILL after a grace)."""

    def __init__(self, logdir: Path, env: dict | None = None):
        self.logdir = logdir
        self.env = env
        self.procs: list[subprocess.Popen] = []
        self.count = 0

    def start(
        self, name: str, argv: list[str], env: dict | None = None, cwd: Path = ROOT
    ) -> subprocess.Popen:
        """Start ``argv`` in ``cwd`` (the repository) with ``env`` (the bench's own by default)."""
        self.count += 1
        path = self.logdir / f"{self.count:03d}-{name}.log"
        with open(path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=self.env if env is None else env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        proc.log_path = path  # type: ignore[attr-defined]
        proc.bench_name = name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def tail(self, proc, lines: int = 30) -> str:
        try:
            text = Path(proc.log_path).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, procs=None, *, grace: float = 15.0) -> None:
        procs = list(self.procs if procs is None else procs)
        for proc in procs:
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.procs = [p for p in self.procs if p.poll() is None]
