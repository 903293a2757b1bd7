"""After a submit commits: count the run in its tenant's queued counter and wake idle workers (NOTIFY).

Never a per-row trigger, and never inside the submit's transaction (a long
caller transaction would hold the tenant row, so every submit and claim of
the tenant would wait). Both go in one statement of their own
(``count_and_notify``): one round trip, and the NOTIFY is delivered only once
the counter is raised, so the claims it starts do not hold the tenant row
against the submit that woke them. Both are debounced per process: the first
of a burst goes out at once; what follows within the interval is folded into
one statement for all tenants and queues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Iterable
from contextlib import nullcontext
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connection, transaction

from runs.db import NOTIFY_CHANNEL, notify_queues, release_connection
from runs.queries import queries

logger = logging.getLogger(__name__)


class AfterSubmit:
    def __init__(self, interval: float):
        self.interval = interval
        self._lock = threading.Lock()
        self._last_flush = float("-inf")
        self._counts: Counter[UUID] = Counter()
        self._queues: set[str] = set()
        self._timer: threading.Timer | None = None

    def request(self, tenant_id: UUID, queue: str) -> None:
        now = time.monotonic()
        with self._lock:
            if self._timer is None and now - self._last_flush >= self.interval:
                self._last_flush = now
                send_now = True
            else:
                send_now = False
                self._counts[tenant_id] += 1
                self._queues.add(queue)
                if self._timer is None:
                    self._timer = threading.Timer(self.interval, self._flush_pending)
                    self._timer.daemon = True
                    self._timer.start()
        if send_now:
            _flush({queue}, Counter({tenant_id: 1}))

    def pending(self, tenant_id: UUID) -> int:
        """Runs of this tenant committed here whose count has not reached the database yet."""
        with self._lock:
            return self._counts.get(tenant_id, 0)

    def _flush_pending(self) -> None:
        with self._lock:
            queues, counts = self._queues, Counter(self._counts)
            self._queues = set()
        try:
            _flush(queues, counts)
        finally:
            release_connection()  # this timer thread's own connection
            with self._lock:
                # Counted only now: until the UPDATE landed, pending() kept them.
                self._counts.subtract(counts)
                self._counts = +self._counts
                self._last_flush = time.monotonic()
                self._timer = None
                if self._counts or self._queues:
                    self._timer = threading.Timer(self.interval, self._flush_pending)
                    self._timer.daemon = True
                    self._timer.start()


def count_and_notify(counts: Counter[UUID], queues: Iterable[str], *, held: bool = False) -> None:
    """Add ``counts`` to their tenants' queued counters and wake the workers of ``queues``.

    In the caller's transaction (the NOTIFY is sent when it commits), or in
    one of its own. Several tenants' rows are locked first, in id order, in a
    statement of their own (``runs/sql/notify.sql``), unless the caller's
    transaction ``held`` them already.
    """
    tenants = sorted(t for t in counts if counts[t])
    params: dict[str, Any] = {
        "tenants": tenants,
        "counts": [counts[t] for t in tenants],
        "channel": NOTIFY_CHANNEL,
        "queues": sorted(set(queues)),
    }
    lock = len(tenants) > 1 and not held
    with transaction.atomic(savepoint=False) if lock else nullcontext():
        with connection.cursor() as cursor:
            if lock:
                cursor.execute(queries.lock_tenants, {"tenants": tenants})
            cursor.execute(queries.count_and_notify, params)


def _flush(queues: set[str], counts: Counter[UUID]) -> None:
    try:
        count_and_notify(counts, queues)
        return
    except Exception:
        logger.exception("could not count queued runs (the reaper reconciles the counters)")
    try:
        # Counting failed, so nothing was sent: the workers are woken all the same.
        if queues:
            notify_queues(queues)
    except Exception:
        # The poll interval still picks the runs up; a submit never fails on this.
        logger.exception("NOTIFY failed for %s", sorted(queues))


_after_submit = AfterSubmit(settings.RUNS_NOTIFY_DEBOUNCE_SECONDS)


def uncounted_submits(tenant_id: UUID) -> int:
    return _after_submit.pending(tenant_id)


def count_and_notify_after_commit(*, tenant_id: UUID, queue: str) -> None:
    """Once the surrounding transaction commits, wake workers and count the run as queued."""
    transaction.on_commit(lambda: _after_submit.request(tenant_id, queue))
