"""A real HTTP receiver of webhooks on loopback, which verifies each delivery with the standardwebhooks library."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: str
    verified_by: list[str] = field(default_factory=list)  # the secrets (by name) its signature verified with


class Receiver:
    """Answers queued statuses (then ``default``); keeps every request; verifies with the secrets it knows."""

    def __init__(self, *, default: int = 200):
        self.default = default
        self.answers: deque[tuple[int, dict[str, str]]] = deque()
        self.received: list[Received] = []
        self.secrets: dict[str, str] = {}
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
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.05)
        raise AssertionError(f"expected {count} deliveries, got {len(self.received)} in {timeout} s")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _take(self, path: str, headers: dict[str, str], body: str) -> tuple[int, dict[str, str]]:
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
            status, headers = receiver._take(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    return Handler
