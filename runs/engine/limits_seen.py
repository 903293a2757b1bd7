"""Whether any kind or queue has a global max_running: which claim and exit statements a process uses.

While none has, the claim and the exit from running are their lighter
statements (``claim``, ``leave_running``), which never claim a run of a
limited kind or queue and write no kind's or queue's counter. While one has,
``claim_limited`` enforces the limits and ``leave_running_limited`` gives their
slots back (runs.engine.limits). A process reads which is in force every
``CHECK_SECONDS``: one that has not yet seen a limit set a moment ago holds
its runs back rather than claim past it, and one that has not yet seen it
lifted gives back nothing that is counted, so a limit is never overshot; the
reaper sets the counters to the truth.
"""

from __future__ import annotations

import threading
import time

from runs.queries import queries, rows


class LimitsSeen:
    CHECK_SECONDS = 2.0

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked_at = float("-inf")
        self._in_force = False

    def in_force(self, cursor) -> bool:
        """Whether a limit is in force, read on ``cursor`` when the last reading is older than CHECK_SECONDS."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked_at < self.CHECK_SECONDS:
                return self._in_force
        cursor.execute(queries.limits_in_force)
        found = bool(rows(cursor)[0]["in_force"])
        with self._lock:
            self._in_force, self._checked_at = found, now
        return found

    def forget(self) -> None:
        """Read it again at the next claim or exit (this process just set or lifted a limit)."""
        with self._lock:
            self._checked_at = float("-inf")


limits_seen = LimitsSeen()
