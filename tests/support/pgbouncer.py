"""A real PgBouncer in transaction-pooling mode, in front of the test database (tests/runs/test_pgbouncer.py).

Debian's ``pgbouncer`` package provides the binary (/usr/sbin/pgbouncer).
Without it the tests are skipped, except under CI, where a missing install
is a failure (the same rule as Chromium in tests/support/browser.py).

Each alias in ``[databases]`` is a pool of its own pointing at the same test
database, so that ``SHOW STATS`` tells which processes (web, workers,
reaper) really went through PgBouncer. The pools are small and hand out
their server connections round robin, so anything that leans on session
state between transactions (a session ``SET``, a prepared statement, a
``WITH HOLD`` cursor, ``LISTEN``) meets another server connection and
breaks.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import dj_database_url
import psycopg
import pytest
from psycopg.rows import dict_row

from tests.conftest import free_port

PGBOUNCER = "/usr/sbin/pgbouncer"


def find_pgbouncer() -> str | None:
    if os.access(PGBOUNCER, os.X_OK):
        return PGBOUNCER
    return shutil.which("pgbouncer")


def require_pgbouncer() -> str:
    """The pgbouncer executable: skip without it, fail under CI."""
    path = find_pgbouncer()
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(
                "pgbouncer not found at /usr/sbin/pgbouncer or on PATH (apt-get install pgbouncer)"
            )
        pytest.skip(
            "pgbouncer not found at /usr/sbin/pgbouncer or on PATH (apt-get install pgbouncer); CI is not set"
        )
    return path


def pgbouncer_version(executable: str) -> tuple[int, ...]:
    """(1, 18, 0) from ``pgbouncer --version`` ("PgBouncer 1.18.0")."""
    out = subprocess.run(
        [executable, "--version"], capture_output=True, text=True, check=True
    ).stdout
    match = re.search(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", out)
    if match is None:
        raise RuntimeError(f"cannot read the version of {executable}: {out!r}")
    return tuple(int(part or 0) for part in match.groups())


def _quoted(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class PgBouncer:
    """One pgbouncer process on a free loopback port; ``url(alias)`` is a DATABASE_URL through it."""

    def __init__(
        self,
        executable: str,
        tmp_path: Path,
        *,
        upstream: str,
        aliases: tuple[str, ...],
        pool_size: int,
        max_prepared_statements: int = 0,
    ):
        self.executable = executable
        self.dir = tmp_path
        self.server = dj_database_url.parse(upstream)
        self.aliases = aliases
        self.pool_size = pool_size
        # PgBouncer >= 1.21 keeps protocol-level prepared statements across server connections.
        self.max_prepared_statements = max_prepared_statements
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = tmp_path / "pgbouncer.log"

    @property
    def user(self) -> str:
        return self.server["USER"] or "postgres"

    @property
    def client_env(self) -> dict[str, str]:
        """What a process behind this PgBouncer sets besides DATABASE_URL."""
        return {"RUNS_LISTEN": "0", "RUNS_DB_PREPARE": "1" if self.max_prepared_statements else "0"}

    def url(self, alias: str) -> str:
        password = self.server["PASSWORD"]
        auth = quote(self.user, safe="") + (":" + quote(password, safe="") if password else "")
        return f"postgres://{auth}@127.0.0.1:{self.port}/{alias}"

    def ini(self) -> str:
        # The server may be a Unix socket directory (the embedded PostgreSQL) or a TCP host.
        target = (
            f"host={_quoted(self.server['HOST'] or '127.0.0.1')} port={self.server['PORT'] or 5432}"
        )
        databases = "\n".join(
            f"{alias} = {target} dbname={_quoted(self.server['NAME'])}" for alias in self.aliases
        )
        settings = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",  # TCP only: no socket file to collide with another instance
            # The test server trusts local connections, so PgBouncer does too;
            # the password in the auth file (if the URL has one) logs it in to the server.
            "auth_type": "trust",
            "auth_file": str(self.dir / "pgbouncer-users.txt"),
            "admin_users": self.user,
            "pool_mode": "transaction",
            "default_pool_size": str(self.pool_size),
            "max_client_conn": "200",
            "server_round_robin": "1",
            # No ignore_startup_parameters: application_name (and client_encoding)
            # are startup parameters PgBouncer itself tracks per client.
        }
        if self.max_prepared_statements:
            settings["max_prepared_statements"] = str(self.max_prepared_statements)
        lines = "\n".join(f"{key} = {value}" for key, value in settings.items())
        return f"[databases]\n{databases}\n\n[pgbouncer]\n{lines}\n"

    def start(self) -> PgBouncer:
        auth = self.dir / "pgbouncer-users.txt"
        password = (self.server["PASSWORD"] or "").replace('"', '""')
        auth.write_text(f'"{self.user}" "{password}"\n')
        for _ in range(3):  # the free port may be taken before pgbouncer binds it
            self.port = free_port()
            config = self.dir / "pgbouncer.ini"
            config.write_text(self.ini())
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [self.executable, *self._run_as(), str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                return self
            self.stop()
            if "Address already in use" not in self.log():
                break
        raise RuntimeError(f"pgbouncer did not start:\n{self.log()}")

    def _run_as(self) -> list[str]:
        """PgBouncer refuses to run as root (it reads its files before it switches user).

        As root it runs as the owner of the server's socket directory (the
        embedded PostgreSQL's data directory is private to its user), or
        as nobody for a TCP server.
        """
        if os.geteuid() != 0:
            return []
        host, user = self.server["HOST"] or "", "nobody"
        if host.startswith("/"):
            owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
            user = owner if owner != "root" else user
        return ["-u", user]

    def _wait_ready(self, timeout: float = 10) -> bool:
        # Not wait_until: a server that does not come up (its port was taken) is tried again on
        # another port, not a failed test.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                self.admin("SHOW VERSION")
                return True
            except psycopg.OperationalError:
                time.sleep(0.05)
        return False

    def admin(self, command: str) -> list[dict]:
        """Rows of an admin console command (``SHOW POOLS``, ``SHOW STATS``, ``SHOW CLIENTS``...)."""
        with psycopg.connect(self.url("pgbouncer"), autocommit=True, connect_timeout=2) as conn:
            with conn.cursor(row_factory=dict_row) as cursor:
                cursor.execute(command)
                return cursor.fetchall()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
