"""The event hub of a web process: one LISTEN connection and one reader for all its open streams.

A stream subscribes to a run with the last seq its client saw. The hub
watches the run (a ``StreamWatch`` row, committed before the first read, so
that the run's Event statements start sending NOTIFY), and one task reads
new Events for every run that was woken, in one query for all of them, and
hands each stream the Events past its own seq, in order. Streams never
query the database themselves: a process holds one LISTEN connection and at
most ``RUNS_STREAM_DB_CONNECTIONS`` others, however many streams are open.

A wake-up can be missed: an Event statement that began before the watch row
committed does not see it, and a LISTEN connection can drop. So every
``RUNS_STREAM_BACKSTOP_SECONDS`` (``RUNS_STREAM_POLL_SECONDS`` while not
listening, or with ``RUNS_LISTEN=0``) all watched runs are read again, in
the same single query. Reading by ``(run, seq)`` makes a second read of the
same Event harmless.

A stream dies with the credential it was opened with: every
``RUNS_STREAM_BACKSTOP_SECONDS`` the hub asks which of its streams' grants
still hold, for all of them at once (runs.streams.grants: at most three
queries, however many streams), and ends the streams whose grant is gone.

The statements are in ``runs/sql/hub.sql``.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Final
from uuid import UUID

import psycopg
from asgiref.sync import sync_to_async
from django.conf import settings
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from runs.db import EVENTS_CHANNEL, connection_kwargs
from runs.queries import queries
from runs.streams import ephemeral, grants

logger = logging.getLogger(__name__)

# Events read per run per query; a run with more is read again at once.
PAGE = 500
# A stream whose client reads slower than this many queued items gets no
# more until it catches up (then the hub reads on from its seq).
HIGH_WATER = 2000
WATCH_REFRESH_SECONDS = 30
# A watch not refreshed for this long belongs to a web process that is gone.
WATCH_STALE_SECONDS = 120


@dataclass(frozen=True)
class StoredEvent:
    run_id: UUID
    seq: int
    type: str
    actor_type: str
    actor_id: str
    payload_json: str  # the Event's payload as the database rendered it
    created_at: datetime


class _Revoked(Enum):
    """The item that ends a stream whose credential no longer holds (one member: ``item is REVOKED`` narrows)."""

    REVOKED = "revoked"


REVOKED: Final = _Revoked.REVOKED
Item = StoredEvent | ephemeral.Ephemeral | _Revoked | None  # None: the hub is shutting down


class Subscription:
    """One stream's place in one run: the last seq handed to it, and what waits to be written."""

    def __init__(self, run_id: UUID, after: int, grant: grants.Grant | None = None):
        self.run_id = run_id
        self.after = after
        self.grant = grant  # what the stream was opened with (None: nothing to check)
        self.items: asyncio.Queue[Item] = asyncio.Queue()
        self.behind = False  # the hub stopped reading for it at HIGH_WATER
        self.revoked = False

    async def get(self, hub: EventHub) -> Item:
        if self.revoked:  # before whatever is still queued: the client may no longer read it
            return REVOKED
        if self.behind and self.items.qsize() < HIGH_WATER // 2:
            self.behind = False
            hub.wake(self.run_id)
        return await self.items.get()


class EventHub:
    """Fans a run's Events out to its streams in this process; see the module's docstring."""

    def __init__(self) -> None:
        self.server = uuid.uuid4()
        self._subs: dict[UUID, set[Subscription]] = {}
        self._dirty: set[UUID] = set()
        self._woken = asyncio.Event()
        self._listening = False
        self._listen_ready = asyncio.Event()
        self._pool: AsyncConnectionPool | None = None
        self._tasks: list[asyncio.Task] = []
        self._start_lock = asyncio.Lock()
        self._watch_lock = asyncio.Lock()
        self._closed = False

    # Streams' side.
    async def subscribe(
        self, run_id: UUID, after: int, grant: grants.Grant | None = None
    ) -> Subscription:
        await self._start()
        sub = Subscription(run_id, after, grant)
        if run_id not in self._subs:
            self._subs[run_id] = set()
            async with self._watch_lock:
                await self._execute(queries.watch_runs, {"runs": [run_id], "server": self.server})
        self._subs.setdefault(run_id, set()).add(sub)
        self.wake(run_id)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.run_id)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subs[sub.run_id]
            if not self._closed:
                self._spawn(self._unwatch(sub.run_id))

    async def _unwatch(self, run_id: UUID) -> None:
        # Watch writes go one at a time, and this one only if nobody
        # subscribed again meanwhile: a delete landing after a new stream's
        # insert would leave that stream on the backstop alone.
        async with self._watch_lock:
            if run_id not in self._subs:
                await self._execute(queries.unwatch_runs, {"runs": [run_id], "server": self.server})

    def wake(self, run_id: UUID) -> None:
        if run_id in self._subs:
            self._dirty.add(run_id)
            self._woken.set()

    @property
    def stream_count(self) -> int:
        return sum(len(subs) for subs in self._subs.values())

    def close(self) -> None:
        """End every stream (the server is stopping): each client reconnects elsewhere with its Last-Event-ID."""
        self._closed = True
        for subs in self._subs.values():
            for sub in subs:
                sub.items.put_nowait(None)

    # The hub's tasks.
    async def _start(self) -> None:
        if self._tasks:
            return
        async with self._start_lock:
            if self._tasks:
                return
            self._pool = AsyncConnectionPool(
                kwargs=connection_kwargs(),
                min_size=1,
                max_size=max(1, settings.RUNS_STREAM_DB_CONNECTIONS),
                open=False,
                name="event-streams",
            )
            await self._pool.open()
            self._tasks = [
                self._spawn(self._read_loop()),
                self._spawn(self._backstop_loop()),
                self._spawn(self._watch_loop()),
                self._spawn(self._grants_loop()),
            ]
            if settings.RUNS_LISTEN:
                self._tasks.append(self._spawn(self._listen_loop()))
                # Listening before the first read, or the first wake-up may be lost.
                try:
                    await asyncio.wait_for(self._listen_ready.wait(), timeout=5)
                except TimeoutError:
                    logger.warning(
                        "event streams: LISTEN not ready; polling every %s s meanwhile",
                        settings.RUNS_STREAM_POLL_SECONDS,
                    )

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        task.add_done_callback(_log_failure)
        return task

    async def _execute(self, statement: str, params: dict[str, Any]) -> None:
        assert self._pool is not None
        try:
            async with self._pool.connection() as conn:
                await conn.execute(statement, params)
        except psycopg.Error:
            # The backstop reads every watched run anyway; the next refresh rewrites the watches.
            logger.warning("event streams: could not update the watches", exc_info=True)

    async def _listen_loop(self) -> None:
        backoff = 0.5
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(**connection_kwargs())
                async with conn:
                    await conn.execute(f"LISTEN {EVENTS_CHANNEL}")
                    self._listening = True
                    self._listen_ready.set()
                    backoff = 0.5
                    # The watches may be gone (a database restarted) and
                    # wake-ups were missed while not listening: rewrite, re-read.
                    await self._refresh_watches()
                    self._wake_all()
                    async for note in conn.notifies():
                        self._on_notify(note.payload)
            except (psycopg.Error, OSError) as exc:
                logger.warning(
                    "event streams: LISTEN connection lost (%s); reconnecting in %.1f s",
                    exc,
                    backoff,
                )
            self._listening = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _on_notify(self, payload: str) -> None:
        decoded = ephemeral.decode(payload)
        if decoded is None:
            return
        run_id, update = decoded
        if update is None:
            self.wake(run_id)
            return
        for sub in self._subs.get(run_id, ()):
            if (
                sub.items.qsize() < HIGH_WATER
            ):  # an update nobody can keep up with is not worth keeping
                sub.items.put_nowait(update)

    async def _backstop_loop(self) -> None:
        while True:
            listening = self._listening and settings.RUNS_LISTEN
            await asyncio.sleep(
                settings.RUNS_STREAM_BACKSTOP_SECONDS
                if listening
                else settings.RUNS_STREAM_POLL_SECONDS
            )
            self._wake_all()

    async def _grants_loop(self) -> None:
        while True:
            await asyncio.sleep(settings.RUNS_STREAM_BACKSTOP_SECONDS)
            await self.check_grants()

    async def check_grants(self) -> None:
        """End the streams whose credential no longer holds: one check for all of them."""
        checked = [
            (sub, sub.grant)
            for subs in self._subs.values()
            for sub in subs
            if sub.grant is not None and not sub.revoked
        ]
        if not checked:
            return
        try:
            holding = await sync_to_async(grants.live_released, thread_sensitive=False)(
                {grant for _, grant in checked}
            )
        except Exception:
            # Streams stay open while the database cannot say; the next check decides.
            logger.warning("event streams: could not check the streams' credentials", exc_info=True)
            return
        for sub, grant in checked:
            if grant not in holding:
                sub.revoked = True
                sub.items.put_nowait(REVOKED)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_REFRESH_SECONDS)
            await self._refresh_watches()
            await self._execute(queries.sweep_watches, {"stale": WATCH_STALE_SECONDS})

    async def _refresh_watches(self) -> None:
        async with self._watch_lock:
            if self._subs:
                await self._execute(
                    queries.watch_runs, {"runs": list(self._subs), "server": self.server}
                )

    def _wake_all(self) -> None:
        for run_id in self._subs:
            self._dirty.add(run_id)
        if self._dirty:
            self._woken.set()

    async def _read_loop(self) -> None:
        while True:
            await self._woken.wait()
            self._woken.clear()
            runs, self._dirty = self._dirty, set()
            cursors = {}
            for run_id in runs:
                subs = [s for s in self._subs.get(run_id, ()) if not s.behind]
                if subs:
                    cursors[run_id] = min(s.after for s in subs)
            if not cursors:
                continue
            try:
                rows = await self._read(cursors)
            except (psycopg.Error, OSError):
                logger.warning("event streams: reading Events failed; retrying", exc_info=True)
                self._dirty |= set(cursors)
                await asyncio.sleep(1)
                self._woken.set()
                continue
            self._hand_out(rows)

    async def _read(self, cursors: dict[UUID, int]) -> list[StoredEvent]:
        assert self._pool is not None
        async with self._pool.connection() as conn, conn.cursor(row_factory=dict_row) as cursor:
            await cursor.execute(
                queries.read_new_events,
                {"runs": list(cursors), "after": list(cursors.values()), "page": PAGE},
            )
            return [StoredEvent(**row) for row in await cursor.fetchall()]

    def _hand_out(self, rows: list[StoredEvent]) -> None:
        by_run: dict[UUID, list[StoredEvent]] = {}
        for row in rows:
            by_run.setdefault(row.run_id, []).append(row)
        for run_id, events in by_run.items():
            for sub in self._subs.get(run_id, ()):
                if sub.behind:  # read again from its own seq once it catches up
                    continue
                for event in events:
                    if event.seq > sub.after:
                        sub.after = event.seq
                        sub.items.put_nowait(event)
                if sub.items.qsize() >= HIGH_WATER:
                    sub.behind = True
            if len(events) == PAGE:
                self.wake(run_id)  # more to read


def _log_failure(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("event streams: a hub task failed", exc_info=task.exception())


_hubs: dict[asyncio.AbstractEventLoop, EventHub] = {}


def get_hub() -> EventHub:
    """The hub of the running event loop (one per web process under an ASGI server)."""
    loop = asyncio.get_running_loop()
    hub = _hubs.get(loop)
    if hub is None:
        hub = _hubs[loop] = EventHub()
    return hub


def close_all() -> None:
    """End every open stream of this process (called when the server stops)."""
    for hub in _hubs.values():
        hub.close()
