"""Real receivers of webhooks on loopback: an HTTP one that verifies each delivery with the standardwebhooks
library, and a tarpit that accepts connections and never answers.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.support.waiting import wait_until


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str
    verified_by: list[str] = field(
        default_factory=list
    )  # the secrets (by name) its signature verified with


class Receiver:
    """Answers queued statuses (then ``default``); keeps every request; verifies with the secrets it knows."""

    def __init__(self, *, default: int = 200):
        self.default = default
        self.answers: deque[tuple[int, dict[str, str]]] = deque()
        self.received: list[Received] = []
        self.secrets: dict[str, str] = {}
        self.on_request = lambda: None  # called as each request arrives, before it is answered
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def answer(self, status: int, **headers: str) -> None:
        self.answers.append((status, headers))

    def wait_for(self, count: int, timeout: float = 30.0) -> list[Received]:
        def arrived() -> bool:
            with self._lock:
                return len(self.received) >= count

        wait_until(
            arrived,
            timeout=timeout,
            what=lambda: f"{count} deliveries; {len(self.received)} arrived",
        )
        with self._lock:
            return list(self.received)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _take(self, path: str, headers: dict[str, str], body: str) -> tuple[int, dict[str, str]]:
        self.on_request()
        received = Received(path=path, headers=headers, body=body)
        for name, secret in self.secrets.items():
            try:
                Webhook(secret).verify(body, headers)
            except WebhookVerificationError:
                continue
            received.verified_by.append(name)
        with self._lock:
            self.received.append(received)
            return self.answers.popleft() if self.answers else (self.default, {})


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format, *args):
            pass

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode()
            status, headers = receiver._take(
                self.path, {k.lower(): v for k, v in self.headers.items()}, body
            )
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    return Handler


class Tarpit:
    """Accepts TCP connections on loopback, reads what it is sent, and never answers.

    Counts the connections it accepted and those the sender hung up on, so a
    test can tell which attempts are still hanging.
    """

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.accepted = 0
        self.hung_up = 0
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._stopping = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"

    def counts(self) -> tuple[int, int]:
        """(accepted, hung up), read together."""
        with self._lock:
            return self.accepted, self.hung_up

    def stop(self) -> None:
        self._stopping = True
        self.sock.close()
        for conn in list(self._conns):
            conn.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self._conns.append(conn)
            threading.Thread(target=self._hold, args=(conn,), daemon=True).start()

    def _hold(self, conn: socket.socket) -> None:
        try:
            while conn.recv(65536):
                pass
        except OSError:
            pass
        with self._lock:
            self.hung_up += 1
