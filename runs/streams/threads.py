"""The body of ``GET /api/threads/{id}/events``: one stream across a thread's turns.

A thread's Events are its turns' (each turn is a run; ``thread.reply``,
``thread.asleep`` and ``thread.closed`` are written on the turn they
concern). The stream follows the turns in order, each through the
process's hub like a run's stream (``runs.streams.sse``), and gives each
Event the id ``<turn>.<seq>``: a client that reconnects with that
``Last-Event-ID`` resumes after it, in that turn or the next. It moves on
to the next turn once a turn has ended and every Event of it was sent;
between turns, while the thread sleeps, it looks for the next turn every
``NEXT_TURN_POLL_SECONDS`` (the hub wakes streams by run, and the next
turn's run does not exist yet). It ends after ``thread.closed``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from uuid import UUID

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import StreamingHttpResponse

from runs.db import release_connection
from runs.states import TERMINAL_STATUSES, ThreadStatus
from runs.streams import ephemeral
from runs.streams.grants import Grant
from runs.streams.hub import REVOKED, get_hub
from runs.streams.sse import RECONNECT_MS, format_ephemeral, format_event

NEXT_TURN_POLL_SECONDS = 1.0

# A thread stream's event id: the turn and the Event's seq in it.
EVENT_ID = re.compile(r"^(\d{1,9})\.(\d{1,9})$")


@dataclass(frozen=True)
class Position:
    turn: int  # the turn whose Events come next (1 at the start)
    after: int  # the last seq of that turn already sent


def parse_position(value: str | None) -> Position | None:
    """A ``Last-Event-ID`` of a thread stream, or None when it is not one (``<turn>.<seq>``)."""
    if value is None or value.strip() == "":
        return Position(turn=1, after=0)
    found = EVENT_ID.match(value.strip())
    if found is None or int(found.group(1)) < 1:
        return None
    return Position(turn=int(found.group(1)), after=int(found.group(2)))


@dataclass(frozen=True)
class _Turn:
    run_id: UUID | None  # None: the thread has no such turn (yet)
    finished: bool
    last_seq: int
    later: bool  # a later turn exists
    closed: bool  # the thread is closed


def _turn(thread_id: UUID, number: int) -> _Turn:
    from runs.models import Run, Thread  # models: loaded after the app registry

    try:
        run = (
            Run.objects.filter(thread_id=thread_id, turn=number)
            .values("id", "status", "last_event_seq")
            .first()
        )
        later = Run.objects.filter(thread_id=thread_id, turn__gt=number).exists()
        closed = Thread.objects.filter(pk=thread_id, status=ThreadStatus.CLOSED).exists()
    finally:
        release_connection()
    if run is None:
        return _Turn(None, False, 0, later, closed)
    return _Turn(
        run["id"], run["status"] in TERMINAL_STATUSES, run["last_event_seq"], later, closed
    )


def thread_stream_response(
    *, thread_id: UUID, position: Position, grant: Grant | None
) -> StreamingHttpResponse:
    response = StreamingHttpResponse(
        _events(thread_id=thread_id, position=position, grant=grant),
        content_type="text/event-stream; charset=utf-8",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _events(
    *, thread_id: UUID, position: Position, grant: Grant | None
) -> AsyncIterator[str]:
    hub = get_hub()
    keepalive = settings.RUNS_STREAM_KEEPALIVE_SECONDS
    turn, after = position.turn, position.after
    yield (f"retry: {RECONNECT_MS}\n: thread {thread_id}, events after turn {turn} seq {after}\n\n")
    quiet_since = time.monotonic()
    while True:
        found = await sync_to_async(_turn, thread_sensitive=False)(thread_id, turn)
        if found.run_id is None:
            if found.later:  # a turn removed by retention: go on with the next
                turn, after = turn + 1, 0
                continue
            if found.closed:
                return
            await asyncio.sleep(NEXT_TURN_POLL_SECONDS)
            if time.monotonic() - quiet_since >= keepalive:
                quiet_since = time.monotonic()
                yield ": keepalive\n\n"
            continue
        sub = await hub.subscribe(found.run_id, after, grant=grant)
        try:
            while True:
                if found.finished and after >= found.last_seq and (found.later or found.closed):
                    break  # every Event of this turn was sent, and no more will come to it
                wait = NEXT_TURN_POLL_SECONDS if found.finished else keepalive
                try:
                    item = await asyncio.wait_for(sub.get(hub), timeout=wait)
                except TimeoutError:
                    if time.monotonic() - quiet_since >= keepalive:
                        quiet_since = time.monotonic()
                        yield ": keepalive\n\n"
                    found = await sync_to_async(_turn, thread_sensitive=False)(thread_id, turn)
                    continue
                if item is None:  # the server is stopping: the client resumes with its id
                    return
                if item is REVOKED:
                    yield ": the credentials this stream was opened with no longer hold\n\n"
                    return
                quiet_since = time.monotonic()
                if isinstance(item, ephemeral.Ephemeral):
                    yield format_ephemeral(item)
                    continue
                after = item.seq
                yield format_event(item, event_id=f"{turn}.{item.seq}")
                if item.type == "thread.closed":
                    return
                if item.type.startswith("run.") and not found.finished:
                    found = await sync_to_async(_turn, thread_sensitive=False)(thread_id, turn)
        finally:
            hub.unsubscribe(sub)
        if found.closed and not found.later:
            return
        turn, after = turn + 1, 0
