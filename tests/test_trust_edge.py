"""The web edge (issue 25): request bodies refused before they are read, secrets kept out of the logs,
and the JSON API under the dashboard's session.

The body and log tests talk to a real `manage.py serve` process over raw sockets and httpx; the session
tests use Django's test client logged in as a real user, with CSRF checks on.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from runs.models import Run
from runs.services import submit_run
from tests.conftest import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024
BODY = 300 * MIB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Web:
    """A `manage.py serve` process on a free port."""

    def __init__(self, processes, **env):
        self.processes = processes
        self.port = free_port()
        self.proc = processes.manage("serve", f"127.0.0.1:{self.port}", **env)

        def up():
            assert self.proc.poll() is None, processes.output(self.proc)
            try:
                return httpx.get(self.base + "/api/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=30, message="the web server to answer")

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.processes.output(self.proc)


class Watch(threading.Thread):
    """The most the server process held while a request was sent: resident memory, and bytes in TMPDIR files.

    Open files are read from /proc, since Python's temporary files have no name in the directory.
    """

    def __init__(self, pid: int, tmpdir: Path):
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.tmpdir = str(tmpdir)
        self.rss_before = self.process.memory_info().rss
        self.max_rss = self.rss_before
        self.max_tmp = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            time.sleep(0.01)

    def sample(self) -> None:
        self.max_rss = max(self.max_rss, self.process.memory_info().rss)
        held = sum(entry.stat().st_size for entry in os.scandir(self.tmpdir) if entry.is_file())
        fds = f"/proc/{self.process.pid}/fd"
        for fd in os.listdir(fds):
            try:
                if os.readlink(f"{fds}/{fd}").startswith(self.tmpdir):
                    held += os.stat(f"{fds}/{fd}").st_size
            except OSError:
                continue  # closed in between
        self.max_tmp = max(self.max_tmp, held)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
        self.sample()


def send_chunked(port: int, head: str, *, total: int = BODY, chunk: int = MIB) -> tuple[bytes, int]:
    """Send ``head`` then a chunked body of ``total`` bytes, reading the answer meanwhile: (answer, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    answer = bytearray()

    def read():
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            answer.extend(data)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    sock.sendall(head.encode())
    frame = b"%x\r\n" % chunk + b"x" * chunk + b"\r\n"
    sent = 0
    try:
        while sent < total:
            sock.sendall(frame)
            sent += chunk
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server closed the connection: the rest was refused
    reader.join(60)
    sock.close()
    return bytes(answer), sent


def status_and_body(answer: bytes) -> tuple[int, bytes]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer[:200]
    return int(head.split()[1]), body


@pytest.fixture
def server_tmp(tmp_path) -> Path:
    path = tmp_path / "server-tmp"
    path.mkdir()
    return path


# Finding 3: bodies are refused before they are read.


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_300_mib_chunked_body_to_the_event_stream_is_refused_unread(processes, server_tmp, method):
    web = Web(processes, TMPDIR=str(server_tmp))
    watch = Watch(web.proc.pid, server_tmp)
    watch.start()
    path = f"/api/runs/{uuid.uuid4()}/events"
    answer, sent = send_chunked(web.port, f"{method} {path} HTTP/1.1\r\n"
                                "Host: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    watch.stop()

    status, body = status_and_body(answer)
    assert status == 413
    assert json.loads(body) == {"detail": f"{method} {path} takes no request body"}
    assert sent < BODY  # cut off, not read to the end
    assert watch.max_tmp < MIB, f"the server wrote {watch.max_tmp} bytes to its temporary directory"
    assert watch.max_rss - watch.rss_before < 50 * MIB


def test_a_chunked_body_past_the_limit_is_cut_off_with_413(processes, server_tmp, tenant, api_key):
    web = Web(processes, TMPDIR=str(server_tmp), RUNS_MAX_BODY_BYTES=str(64 * 1024))
    watch = Watch(web.proc.pid, server_tmp)
    watch.start()
    answer, sent = send_chunked(web.port, "POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
                                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n", chunk=16 * 1024)
    watch.stop()

    status, body = status_and_body(answer)
    assert status == 413
    assert json.loads(body) == {"detail": "the request body is larger than the limit of 65536 bytes"}
    assert sent < BODY
    assert watch.max_tmp < MIB and watch.max_rss - watch.rss_before < 50 * MIB
    # Every route: the dashboard's login form too (plain text outside /api/).
    answer, sent = send_chunked(web.port, "POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n", chunk=16 * 1024)
    status, body = status_and_body(answer)
    assert (status, body) == (413, b"the request body is larger than the limit of 65536 bytes")
    assert sent < BODY


def test_a_chunked_body_within_the_limit_is_read_whole(processes, tenant, api_key):
    web = Web(processes)
    payload = json.dumps({"kind": "echo", "input": {"text": "sent in chunks"}}).encode()
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
    sock.sendall(f"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {api_key}\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode())
    for piece in (payload[:10], payload[10:]):
        sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
    sock.sendall(b"0\r\n\r\n")
    answer = b"".join(iter(lambda: sock.recv(65536), b""))
    sock.close()
    status, body = status_and_body(answer)
    assert status == 202, answer
    assert Run.objects.get(pk=json.loads(body)["id"]).input["text"] == "sent in chunks"


@pytest.mark.parametrize(("method", "path"), [("POST", "/api/runs"), ("GET", "/api/runs/{run}/events"),
                                              ("POST", "/admin/login/")])
def test_a_content_length_over_the_limit_is_answered_before_the_body_is_sent(processes, method, path):
    web = Web(processes)
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
    sock.sendall(f"{method} {path.format(run=uuid.uuid4())} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Content-Length: {BODY}\r\nContent-Type: application/json\r\n\r\n".encode())
    answer = b"".join(iter(lambda: sock.recv(65536), b""))  # nothing of the body sent: the server answers anyway
    sock.close()
    status, body = status_and_body(answer)
    assert status == 413
    if path.startswith("/api/"):
        assert "detail" in json.loads(body)


# Finding 7: secrets sent in URLs never reach the logs.


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_keys_and_tokens_in_urls_never_reach_the_server_log(processes, tenant, api_key, log_format):
    web = Web(processes, RUNS_LOG_FORMAT=log_format, LOG_LEVEL="DEBUG")
    run = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})
    token = "s3cr3t-stream-token-" + uuid.uuid4().hex
    password = "hunter2-" + uuid.uuid4().hex
    guessed = "ak_deadbeef_" + uuid.uuid4().hex
    urls = [
        f"/api/runs?api_key={api_key}",
        f"/api/runs/{run.pk}/events?api_key={api_key}",
        f"/api/runs/{run.pk}/events?token={token}",
        f"/api/runs/{run.pk}/events?token={api_key}",
        f"/api/runs/{api_key}/events",
        f"/api/runs/{run.pk}?access_token={token}&password={password}",
        f"/{guessed}/?key={token}",
        f"/runs/?q=x&secret={password}",
    ]
    answers = [httpx.get(web.base + url, timeout=10).status_code for url in urls]
    assert all(400 <= status < 500 for status in answers), answers
    web.proc.terminate()
    web.proc.wait(20)

    log = web.output()
    assert "Unauthorized" in log and "Not Found" in log  # the requests were logged ...
    for secret in (api_key, api_key.split("_", 2)[2], token, password, guessed):
        assert secret not in log, f"{secret} is in the server's log:\n{log}"  # ... their secrets not
