"""Wake idle workers after a submit commits: NOTIFY from the application, debounced.

Never a per-row trigger: a burst of submits sends its first NOTIFY at once
and folds the rest into one more per queue after the debounce interval.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import connection, transaction

from workers.queue import notify_queues, release_connection

logger = logging.getLogger(__name__)


class Debouncer:
    def __init__(self, interval: float):
        self.interval = interval
        self._lock = threading.Lock()
        self._last_sent: dict[str, float] = {}
        self._pending: set[str] = set()
        self._timer: threading.Timer | None = None

    def request(self, queue: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_sent.get(queue, float("-inf")) >= self.interval:
                self._last_sent[queue] = now
                send_now = True
            else:
                send_now = False
                self._pending.add(queue)
                if self._timer is None:
                    self._timer = threading.Timer(self.interval, self._flush)
                    self._timer.daemon = True
                    self._timer.start()
        if send_now:
            _send({queue})

    def _flush(self) -> None:
        with self._lock:
            queues, self._pending = self._pending, set()
            self._timer = None
            now = time.monotonic()
            for queue in queues:
                self._last_sent[queue] = now
        if queues:
            try:
                _send(queues)
            finally:
                release_connection()  # this timer thread's own connection


def _send(queues: set[str]) -> None:
    try:
        notify_queues(queues)
    except Exception:
        # The poll interval still picks the run up; a submit never fails on this.
        logger.exception("NOTIFY failed for %s", sorted(queues))


_debouncer = Debouncer(settings.RUNS_NOTIFY_DEBOUNCE_SECONDS)


def count_and_notify_after_commit(*, tenant_id, queue: str) -> None:
    """Once the submit commits: count the run in its tenant's queued counter, then wake workers.

    Outside the submit's transaction, so that a long caller transaction never
    holds the tenant row (every submit and claim of the tenant would wait).
    """

    def after_commit() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("UPDATE runs_tenant SET queued = queued + 1 WHERE id = %s", [tenant_id])
        except Exception:
            logger.exception("could not count a queued run (the reaper reconciles the counter)")
        _debouncer.request(queue)

    transaction.on_commit(after_commit)
