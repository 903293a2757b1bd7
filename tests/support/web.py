"""A real `manage.py serve` process for a test, and what its clients need: SSE reading, an API key's
header, a session's cookie, the first answer of a stream request.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass

import httpx
from django.test import Client

from tests.conftest import free_port
from tests.support.waiting import wait_until


@dataclass
class SSE:
    """One server-sent event, as a client reads it."""

    id: int | str | None  # a run's stream: the Event's seq; a thread's: "<turn>.<seq>"
    event: str
    data: dict


class Web:
    """A `manage.py serve` process on a port of its own, restartable on that port: ``Web(processes, **env).start()``."""

    def __init__(self, processes, **env):
        self.processes = processes
        self.port = free_port()
        self.env = env
        self.proc = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Web:
        self.proc = self.processes.manage("serve", f"127.0.0.1:{self.port}", **self.env)

        def up():
            assert self.proc.poll() is None, self.output()
            try:
                return httpx.get(self.base + "/api/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, what="the web server to answer")
        return self

    def output(self) -> str:
        return self.processes.output(self.proc)

    def stop(self, sig=signal.SIGTERM) -> None:
        self.proc.send_signal(sig)
        self.proc.wait(20)


def read_events(
    response: httpx.Response,
    *,
    until=None,
    seen: list[SSE] | None = None,
    comments: list[str] | None = None,
    comments_until=None,
) -> list[SSE]:
    """Parse SSE from a streaming response until it ends, ``until(event)`` or ``comments_until(comments)`` is true.

    One line iterator per response: abandoning one would close the connection.
    """
    seen = [] if seen is None else seen
    lines = getattr(response, "sse_lines", None)
    if lines is None:
        lines = response.sse_lines = response.iter_lines()
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            if comments is not None:
                comments.append(line)
                if comments_until is not None and comments_until(comments):
                    return seen
            continue
        if line == "":
            if "data" in fields:
                event = SSE(
                    _event_id(fields["id"]) if "id" in fields else None,
                    fields.get("event", "message"),
                    json.loads(fields["data"]),
                )
                seen.append(event)
                if until is not None and until(event):
                    return seen
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value[1:] if value.startswith(" ") else value
    return seen


def _event_id(value: str) -> int | str:
    return int(value) if value.isdigit() else value


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def session_of(user) -> dict:
    client = Client()
    client.force_login(user)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


def first_answer(url: str, headers: dict | None = None) -> tuple[int, dict]:
    """The status and JSON error of a stream request (a 200 is closed after its first bytes)."""
    with httpx.stream("GET", url, headers=headers or {}, timeout=5) as response:
        if response.status_code == 200:
            return 200, {}
        response.read()
        return response.status_code, response.json() if response.content else {}
