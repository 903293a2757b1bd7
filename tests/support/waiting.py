"""Waiting on a condition, never for a fixed time: the one poll loop of the test suite.

A test that sleeps "long enough" is slow when the machine is idle and flaky when it is busy. A test
waits for what it needs instead (a run's status, a line in a log, a request received), and fails with
a sentence saying what never happened.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until[T](
    predicate: Callable[[], T],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str | Callable[[], str] = "the condition",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that.

    After ``timeout`` seconds the test fails with "timed out after 30 s waiting for <what>"; ``what``
    may be a function, called then, to add what was seen instead (the run's status, the last sample).
    ``predicate`` may act as well as look (run one burst of a worker, one pass of a loop): it is
    called again every ``interval`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            pytest.fail(f"timed out after {timeout:g} s waiting for {described}")
        time.sleep(interval)
