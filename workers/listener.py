"""LISTEN on one dedicated connection, outside the pool; wakes the claim loop.

A lost connection is re-established with a capped backoff; meanwhile the
worker's poll interval keeps it claiming.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from collections.abc import Callable

import psycopg

from runs.db import CONTROL_PAYLOAD, NOTIFY_CHANNEL, connection_kwargs

logger = logging.getLogger(__name__)


class Listener:
    def __init__(
        self, *, queues: set[str], on_notify: Callable[[], None], on_control: Callable[[], None]
    ):
        self.queues = queues
        self.on_notify = on_notify
        self.on_control = on_control  # a person cancelled or paused a run: heartbeat now
        self._stop = threading.Event()
        # With its creator's context: its lines say which worker they come from.
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self._run,), name="listener", daemon=True
        )
        self._conn: psycopg.Connection | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=3)

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                with psycopg.connect(**connection_kwargs()) as conn:
                    self._conn = conn
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    backoff = 0.5
                    # Something may have been queued while we were not listening.
                    self.on_notify()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=1.0):
                            if note.payload in self.queues:
                                self.on_notify()
                            elif note.payload == CONTROL_PAYLOAD:
                                self.on_control()
            except Exception as exc:
                if self._stop.is_set():
                    return
                logger.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)
