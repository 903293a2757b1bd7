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
from django.test import Client

from runs.keys import create_api_key
from runs.models import Event, Membership, Run
from runs.services import submit_run
from tests.support.factories import MembershipFactory, TenantFactory
from tests.support.web import Web

pytestmark = pytest.mark.django_db(transaction=True)

MIB = 1024 * 1024
BODY = 300 * MIB


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
            time.sleep(0.01)  # the sampling interval: the watch measures, it waits for nothing

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
def test_a_300_mib_chunked_body_to_the_event_stream_is_refused_unread(
    processes, server_tmp, method
):
    web = Web(processes, TMPDIR=str(server_tmp)).start()
    watch = Watch(web.proc.pid, server_tmp)
    watch.start()
    path = f"/api/runs/{uuid.uuid4()}/events"
    answer, sent = send_chunked(
        web.port,
        f"{method} {path} HTTP/1.1\r\n"
        "Host: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
    )
    watch.stop()

    status, body = status_and_body(answer)
    assert status == 413
    assert json.loads(body) == {"detail": f"{method} {path} takes no request body"}
    assert sent < BODY  # cut off, not read to the end
    assert watch.max_tmp < MIB, f"the server wrote {watch.max_tmp} bytes to its temporary directory"
    assert watch.max_rss - watch.rss_before < 50 * MIB


def test_a_chunked_body_past_the_limit_is_cut_off_with_413(processes, server_tmp, tenant, api_key):
    web = Web(processes, TMPDIR=str(server_tmp), RUNS_MAX_BODY_BYTES=str(64 * 1024)).start()
    watch = Watch(web.proc.pid, server_tmp)
    watch.start()
    answer, sent = send_chunked(
        web.port,
        "POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {api_key}\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        chunk=16 * 1024,
    )
    watch.stop()

    status, body = status_and_body(answer)
    assert status == 413
    assert json.loads(body) == {
        "detail": "the request body is larger than the limit of 65536 bytes"
    }
    assert sent < BODY
    assert watch.max_tmp < MIB and watch.max_rss - watch.rss_before < 50 * MIB
    # Every route: the dashboard's login form too (plain text outside /api/).
    answer, sent = send_chunked(
        web.port,
        "POST /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
        chunk=16 * 1024,
    )
    status, body = status_and_body(answer)
    assert (status, body) == (413, b"the request body is larger than the limit of 65536 bytes")
    assert sent < BODY


def test_a_chunked_body_within_the_limit_is_read_whole(processes, tenant, api_key):
    web = Web(processes).start()
    payload = json.dumps({"kind": "echo", "input": {"text": "sent in chunks"}}).encode()
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
    sock.sendall(
        f"POST /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {api_key}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
    )
    for piece in (payload[:10], payload[10:]):
        sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
    sock.sendall(b"0\r\n\r\n")
    answer = b"".join(iter(lambda: sock.recv(65536), b""))
    sock.close()
    status, body = status_and_body(answer)
    assert status == 202, answer
    assert Run.objects.get(pk=json.loads(body)["id"]).input["text"] == "sent in chunks"


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/api/runs"), ("GET", "/api/runs/{run}/events"), ("POST", "/admin/login/")],
)
def test_a_content_length_over_the_limit_is_answered_before_the_body_is_sent(
    processes, method, path
):
    web = Web(processes).start()
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=30)
    sock.sendall(
        f"{method} {path.format(run=uuid.uuid4())} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Length: {BODY}\r\nContent-Type: application/json\r\n\r\n".encode()
    )
    answer = b"".join(
        iter(lambda: sock.recv(65536), b"")
    )  # nothing of the body sent: the server answers anyway
    sock.close()
    status, body = status_and_body(answer)
    assert status == 413
    if path.startswith("/api/"):
        assert "detail" in json.loads(body)


# Finding 7: secrets sent in URLs never reach the logs.


@pytest.mark.parametrize("log_format", ["console", "json"])
def test_keys_and_tokens_in_urls_never_reach_the_server_log(processes, tenant, api_key, log_format):
    web = Web(processes, RUNS_LOG_FORMAT=log_format, LOG_LEVEL="DEBUG").start()
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
        assert secret not in log, (
            f"{secret} is in the server's log:\n{log}"
        )  # ... their secrets not


# Finding 13: the JSON API under the dashboard's session.


def session_client(membership) -> tuple[Client, str]:
    """A browser-like client logged in as the membership's user, with CSRF checks on, and its CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(membership.user)
    assert client.get("/").status_code == 200  # the dashboard sets the CSRF cookie, as in a browser
    return client, client.cookies["csrftoken"].value


def post_json(client: Client, path: str, body: dict, csrf: str | None = None):
    headers = {"X-CSRFToken": csrf} if csrf else {}
    return client.post(path, json.dumps(body), content_type="application/json", headers=headers)


def test_a_logged_in_user_reads_and_submits_through_the_api_for_their_selected_tenant():
    operator = MembershipFactory(role=Membership.Role.OPERATOR)
    mine = submit_run(tenant=operator.tenant, kind="echo", input={"text": "mine"})
    other = submit_run(tenant=TenantFactory(), kind="echo", input={"text": "another tenant's"})
    client, csrf = session_client(operator)

    listed = client.get("/api/runs")
    assert listed.status_code == 200
    assert [item["id"] for item in listed.json()["items"]] == [str(mine.pk)]
    assert client.get(f"/api/runs/{mine.pk}").status_code == 200
    assert client.get(f"/api/runs/{other.pk}").status_code == 404
    assert (
        post_json(client, f"/api/runs/{other.pk}/cancel", {}, csrf).status_code == 404
    )  # 404 before 403

    refused = post_json(client, "/api/runs", {"kind": "echo", "input": {"text": "no token"}})
    assert refused.status_code == 403
    assert "CSRF token" in refused.json()["detail"]
    submitted = post_json(
        client, "/api/runs", {"kind": "echo", "input": {"text": "with token"}}, csrf
    )
    assert submitted.status_code == 202, submitted.content
    run = Run.objects.get(pk=submitted.json()["id"])
    assert run.tenant_id == operator.tenant_id
    queued = Event.objects.get(run=run, type="run.queued")
    assert (queued.actor_type, queued.actor_id) == ("user", str(operator.user.pk))

    # The operator controls runs but cannot approve: 403 before the 409 of a run with nothing to approve.
    assert post_json(client, f"/api/runs/{mine.pk}/pause", {}, csrf).status_code in (200, 202)
    approve = post_json(client, f"/api/runs/{mine.pk}/approve", {}, csrf)
    assert approve.status_code == 403
    assert "operator" in approve.json()["detail"]


def test_the_session_acts_for_the_tenant_selected_on_the_dashboard():
    first = MembershipFactory(tenant__name="A first", role=Membership.Role.APPROVER)
    second = MembershipFactory(
        user=first.user, tenant__name="B second", role=Membership.Role.VIEWER
    )
    in_first = submit_run(tenant=first.tenant, kind="echo", input={"text": "a"})
    in_second = submit_run(tenant=second.tenant, kind="echo", input={"text": "b"})
    client, csrf = session_client(first)

    assert [item["id"] for item in client.get("/api/runs").json()["items"]] == [str(in_first.pk)]
    assert (
        post_json(client, f"/api/runs/{in_first.pk}/approve", {}, csrf).status_code == 409
    )  # allowed, no approval

    switched = client.post(
        "/tenant/", {"tenant": str(second.tenant_id)}, headers={"X-CSRFToken": csrf}
    )
    assert switched.status_code == 302
    assert [item["id"] for item in client.get("/api/runs").json()["items"]] == [str(in_second.pk)]
    assert client.get(f"/api/runs/{in_first.pk}").status_code == 404
    # A viewer there: reads, submits nothing.
    refused = post_json(client, "/api/runs", {"kind": "echo", "input": {"text": "x"}}, csrf)
    assert refused.status_code == 403
    assert refused.json() == {
        "detail": "your role in B second (viewer) does not allow this (it needs the "
        "'runs:write' scope)"
    }
    assert post_json(client, f"/api/runs/{in_second.pk}/cancel", {}, csrf).status_code == 403


def test_keys_keep_their_precedence_beside_the_session(tenant, api_key):
    member = MembershipFactory(tenant=tenant)
    client, csrf = session_client(member)
    # A key sent is the only credential looked at: a bad one is 401 even from a logged-in browser.
    assert client.get("/api/runs", headers={"Authorization": "Bearer ak_nope"}).status_code == 401
    read_only = create_api_key(tenant=tenant, name="reader", scopes=["runs:read"]).secret
    keyed = post_json(
        Client(headers={"Authorization": f"Bearer {read_only}"}),
        "/api/runs",
        {"kind": "echo", "input": {"text": "x"}},
    )
    assert keyed.status_code == 403 and keyed.json() == {
        "detail": "this API key lacks the 'runs:write' scope"
    }
    assert Client().get("/api/runs").status_code == 401
    # A signed-in user of no tenant: nothing to act for.
    lone = Client()
    lone.force_login(MembershipFactory().user.__class__.objects.create_user("lone", password="x"))
    answer = lone.get("/api/runs")
    assert answer.status_code == 403 and "not a member of any tenant" in answer.json()["detail"]
