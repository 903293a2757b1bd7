"""The request body limit, enforced before any of the body is read: the outermost layer of ``config.asgi``.

Django checks ``DATA_UPLOAD_MAX_MEMORY_SIZE`` only when a view reads the
body, and not for multipart file parts; and its ASGI handler (which serves
the event streams) reads the whole body into a temporary file before it
even looks at the URL. So an unauthenticated client could make the server
write any amount to disk. Here a request is refused before that:

- a method that takes no body (GET, HEAD, OPTIONS, TRACE), and the event
  stream whatever its method, is refused if it announces one at all;
- a ``Content-Length`` over the limit is refused at once, unread (the
  server never reads past a ``Content-Length``);
- a chunked body is read into memory up to the limit and refused as soon
  as it passes it; one within the limit reaches Django with a
  ``Content-Length``, which Django's WSGI handler needs to read it at all.

Hand-written: uvicorn and granian have no body limit, and no maintained
ASGI middleware does this (Starlette's limits apply to multipart parts,
after routing). The answer is 413, JSON ``{"detail": ...}`` under /api/,
with ``Connection: close`` so the server stops reading the rest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

BODYLESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})


class BodyLimit:
    """ASGI middleware: refuse a body over ``limit`` bytes (None: no limit), and any body where none is taken."""

    def __init__(
        self, app: ASGIApp, *, limit: int | None, bodyless_paths: re.Pattern[str] | None = None
    ):
        self.app = app
        self.limit = limit
        self.bodyless_paths = bodyless_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length, chunked = _announced(scope["headers"])
        if length == -1:
            return await _refuse(
                scope, send, 400, "the Content-Length header is not a number of bytes"
            )
        if self._takes_no_body(scope):
            if chunked or length:
                return await _refuse(
                    scope, send, 413, f"{scope['method']} {scope['path']} takes no request body"
                )
            return await self.app(scope, receive, send)
        if self.limit is not None and length is not None and length > self.limit:
            return await _refuse(scope, send, 413, self._too_large())
        if not chunked:
            return await self.app(
                scope, receive, send
            )  # the server reads no further than Content-Length
        return await self._chunked(scope, receive, send)

    def _takes_no_body(self, scope: Scope) -> bool:
        return scope["method"] in BODYLESS_METHODS or bool(
            self.bodyless_paths and self.bodyless_paths.match(scope["path"])
        )

    def _too_large(self) -> str:
        return f"the request body is larger than the limit of {self.limit} bytes"

    async def _chunked(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None  # the client left before the end of its body: nobody to answer
            body += message.get("body", b"")
            if self.limit is not None and len(body) > self.limit:
                return await _refuse(scope, send, 413, self._too_large())
            if not message.get("more_body", False):
                break
        headers = [
            (name, value)
            for name, value in scope["headers"]
            if name.lower() != b"transfer-encoding"
        ]
        headers.append((b"content-length", str(len(body)).encode()))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect, when it comes
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        return await self.app({**scope, "headers": headers}, replay, send)


def _announced(headers: list[tuple[bytes, bytes]]) -> tuple[int | None, bool]:
    """The Content-Length (None: absent; -1: not a number) and whether a Transfer-Encoding is sent."""
    length: int | None = None
    chunked = False
    for name, value in headers:
        name = name.lower()
        if name == b"content-length":
            text = value.strip()
            length = int(text) if text.isdigit() else -1
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    if scope["path"].startswith("/api/"):
        content_type, body = b"application/json", json.dumps({"detail": detail}).encode()
    else:
        content_type, body = b"text/plain; charset=utf-8", detail.encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
