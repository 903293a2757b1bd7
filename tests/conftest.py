"""Shared fixtures. Every test runs against real PostgreSQL (embedded or DATABASE_URL)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from django.db import connection
from django.test import Client

from runs.keys import create_api_key
from runs.models import Run
from tests.support.factories import TenantFactory

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def chromium() -> str:
    """Debian's Chromium for the browser tests: skipped without it, except under CI (tests/support/browser.py)."""
    from tests.support.browser import require_chromium

    return require_chromium()


@pytest.fixture
def media_root(settings, tmp_path) -> Path:
    """MEDIA_ROOT in the test's own temporary folder: the files it makes (artifacts) go there."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return Path(settings.MEDIA_ROOT)


@pytest.fixture
def tenant(db):
    return TenantFactory()


@pytest.fixture
def api_key(tenant):
    return create_api_key(tenant=tenant, name="test").secret


@pytest.fixture
def api(api_key):
    """A Django test client that sends the tenant's API key."""
    return Client(headers={"Authorization": f"Bearer {api_key}"})


def test_database_url() -> str:
    """DATABASE_URL of the test database, for worker processes started by a test."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


def free_port() -> int:
    """A TCP port on loopback that nothing listens on just now (for a server a test starts)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Processes:
    """Worker and reaper processes of one test; whatever is left is killed at teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.procs: list[subprocess.Popen] = []

    def env(self, **extra) -> dict:
        env = os.environ.copy()
        env["DATABASE_URL"] = test_database_url()
        env["PYTHONUNBUFFERED"] = "1"
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def manage(self, *args: str, wrap: tuple[str, ...] = (), **env) -> subprocess.Popen:
        """``manage.py *args`` in a process of its own; ``wrap`` goes before it (``ip netns exec <ns>``)."""
        log = open(self.tmp_path / f"proc-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [*wrap, sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        proc.log_path = log.name  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def worker(self, *args: str, wrap: tuple[str, ...] = (), **env) -> subprocess.Popen:
        return self.manage("runworker", *args, wrap=wrap, **env)

    def run(self, *args: str, timeout: float = 60, **env) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.env(**env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def output(self, proc) -> str:
        return Path(proc.log_path).read_text(errors="replace")

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def processes(tmp_path):
    procs = Processes(tmp_path)
    yield procs
    procs.stop_all()


def fresh(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)
