"""The body of ``GET /api/runs/{id}/events``: Server-Sent Events from the process's hub.

Each Event is written as ``id:`` (its seq), ``event:`` (its type) and one
``data:`` line of JSON; an ephemeral update (``ctx.emit``) has no ``id:``,
so a client's ``Last-Event-ID`` always names a stored Event. The stream
ends after the run's terminal Event (a client that reconnects then gets 204,
which tells ``EventSource`` to stop), and when the server stops (the client
reconnects with its ``Last-Event-ID`` and loses nothing).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from uuid import UUID

from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.http import HttpRequest, StreamingHttpResponse

from runs.errors import tenant_error
from runs.states import TERMINAL_EVENT_TYPES
from runs.streams import ephemeral
from runs.streams.grants import Grant
from runs.streams.hub import REVOKED, StoredEvent, get_hub

# How long a client waits before reconnecting, in ms (the SSE `retry:` field).
RECONNECT_MS = 2000


def streams_served(request: HttpRequest) -> bool:
    """Whether the server that answered ``request`` can send an event stream as it happens.

    An ASGI server can: Django's ASGI handler answered the request, or
    ``config.asgi`` handed it to Django's WSGI handler in a thread (its
    streams stay on the event loop; the request carries the ASGI scope).
    Under a plain WSGI server an event stream is not sent until it ends
    (Django buffers an async body there).
    """
    return isinstance(request, ASGIRequest) or request.META.get("asgi.scope") is not None


def stream_response(
    *, run_id: UUID, after: int, last_seq: int, terminal: bool, grant: Grant | None = None
) -> StreamingHttpResponse:
    """The streaming response for a run whose Events past ``after`` the client wants.

    ``last_seq`` and ``terminal`` are the run's as read when the stream was
    opened: a finished run's stream ends once it has replayed up to there.
    ``grant`` is what it was opened with: the hub ends the stream soon after
    that stops holding (runs.streams.grants).
    """
    response = StreamingHttpResponse(
        _events(run_id=run_id, after=after, close_at=last_seq if terminal else None, grant=grant),
        content_type="text/event-stream; charset=utf-8",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
    return response


async def _events(
    *, run_id: UUID, after: int, close_at: int | None, grant: Grant | None
) -> AsyncIterator[str]:
    hub = get_hub()
    sub = await hub.subscribe(run_id, after, grant=grant)
    try:
        # Sent at once, so that the client (and any proxy) sees the stream open.
        yield f"retry: {RECONNECT_MS}\n: run {run_id}, events after {after}\n\n"
        if close_at is not None and after >= close_at:
            return
        keepalive = settings.RUNS_STREAM_KEEPALIVE_SECONDS
        while True:
            try:
                item = await asyncio.wait_for(sub.get(hub), timeout=keepalive)
            except TimeoutError:
                yield ": keepalive\n\n"
                continue
            if item is None:  # the server is stopping
                return
            if item is REVOKED:
                # A client that reconnects is refused (401), which tells EventSource to stop.
                yield ": the credentials this stream was opened with no longer hold\n\n"
                return
            if isinstance(item, ephemeral.Ephemeral):
                yield format_ephemeral(item)
                continue
            yield format_event(item)
            if item.type in TERMINAL_EVENT_TYPES or (close_at is not None and item.seq >= close_at):
                return
    finally:
        hub.unsubscribe(sub)


def format_event(event: StoredEvent, *, event_id: str | None = None) -> str:
    """One stored Event as SSE; its ``id:`` is its seq unless ``event_id`` says otherwise (a thread's stream)."""
    data = (
        f'{{"run_id":"{event.run_id}","seq":{event.seq},"type":{json.dumps(event.type)},'
        f'"at":"{event.created_at.isoformat()}",'
        f'"actor":{{"type":{json.dumps(event.actor_type)},"id":{json.dumps(event.actor_id)}}},'
        f'"data":{_one_line(_tenant_payload(event.payload_json))}}}'
    )
    return f"id: {event_id or event.seq}\nevent: {_field(event.type)}\ndata: {data}\n\n"


def format_ephemeral(update: ephemeral.Ephemeral) -> str:
    data = json.dumps(
        {
            "run_id": str(update.run_id),
            "type": update.type,
            "step": update.step,
            "data": update.data,
        },
        separators=(",", ":"),
    )
    return f"event: {_field(update.type)}\ndata: {data}\n\n"


def _field(value: str) -> str:
    # A line break would end the field and let the rest forge another one.
    return value.replace("\r", " ").replace("\n", " ")


def _tenant_payload(json_text: str) -> str:
    """The payload with its ``error`` as tenants see it (runs.errors); others pass through unparsed."""
    if '"error"' not in json_text:
        return json_text
    payload = json.loads(json_text)
    if isinstance(payload, dict) and isinstance(payload.get("error"), str):
        payload["error"] = tenant_error(payload["error"])
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def _one_line(json_text: str) -> str:
    # jsonb's text form has no raw line breaks (they are escaped in strings),
    # but a data line must hold one line whatever it is given.
    return json_text.replace("\r", "").replace("\n", "")
