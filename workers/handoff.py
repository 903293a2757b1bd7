"""One hand-off between two threads: a run's thread waits while its step thread, or the committer, answers."""

from __future__ import annotations

import _thread


class Signal:
    """A one-shot ``threading.Event`` for one hand-off between two threads, at a fraction of its cost.

    ``threading.Event`` is a condition variable written in Python (a lock
    made and queued per wait); this is one C lock, held until ``set()``.
    A run hands each step to its step thread and each checkpoint to the
    committer and waits for the answer: several hand-offs per step, which
    for fast steps cost the worker more than anything else in Python.
    ``set()`` may be called once.
    """

    __slots__ = ("_lock", "_set")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()
        self._set = False

    def set(self) -> None:
        self._set = True
        self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """True once set; False when ``timeout`` (seconds) passed first."""
        if self._set:
            return True
        if timeout is None:
            acquired = self._lock.acquire()
        elif timeout <= 0:
            acquired = self._lock.acquire(False)
        else:
            acquired = self._lock.acquire(True, timeout)
        if acquired:
            self._lock.release()  # for any other waiter
        return acquired
