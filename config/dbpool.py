"""What every process's connection pool does so that a PostgreSQL restart or failover costs no request.

Two callbacks of psycopg's pool (``OPTIONS["pool"]`` in config/settings.py):

- ``returned`` (the pool's ``reset``): notes when a connection came back.
- ``check`` (the pool's ``check``): a connection that has sat in the pool
  for ``IDLE_CHECK_SECONDS`` or more is tried (one empty query) before it is
  lent; a broken one is thrown away and another taken, so the first request
  after a restart gets a live connection, not an error. A connection handed
  straight back and forth (a busy worker's, between its statements) is lent
  without the round trip: a server gone meanwhile shows as a connection error
  that the engine's statements retry (``runs.db.with_retries``).

And the delay between the pool's attempts to connect while the server is
away: psycopg's pool doubles it from 1 s with every failed attempt, so that
after a restart of 10 s a process waited up to 8 s more before it tried
again (and a request that needed a connection meanwhile failed after the
pool's timeout). ``RECONNECT_DELAY_MAX`` caps it: the next attempt after the
server is back comes within that many seconds.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

from psycopg_pool import ConnectionPool

logger = logging.getLogger(__name__)

IDLE_CHECK_SECONDS = 0.25
RECONNECT_DELAY_MAX = 1.0

_returned_at: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def returned(conn: Any) -> None:
    _returned_at[conn] = time.monotonic()


def check(conn: Any) -> None:
    at = _returned_at.get(conn)
    if at is None or time.monotonic() - at >= IDLE_CHECK_SECONDS:
        ConnectionPool.check_connection(conn)


_capped = False


def cap_reconnect_delay(limit: float = RECONNECT_DELAY_MAX) -> bool:
    """Cap psycopg's pool's delay between attempts to connect at ``limit`` seconds; False if it cannot.

    psycopg_pool keeps the delay in ``AttemptWithBackoff`` (its public
    ``psycopg_pool.base`` module: ``update_delay`` sets ``delay``), the same
    from 3.1 through 3.3. With another shape, nothing is changed and one
    warning is logged. Called once per process, when the settings are read.
    """
    global _capped
    if _capped:
        return True
    try:
        from psycopg_pool.base import AttemptWithBackoff
    except ImportError:
        logger.warning("psycopg_pool has no AttemptWithBackoff: reconnection delays are its own")
        return False
    original = getattr(AttemptWithBackoff, "update_delay", None)
    if original is None:
        logger.warning("psycopg_pool has no AttemptWithBackoff.update_delay: delays are its own")
        return False

    def update_delay(self: Any, now: float) -> None:
        original(self, now)
        self.delay = min(self.delay, limit)

    AttemptWithBackoff.update_delay = update_delay  # type: ignore[method-assign]
    _capped = True
    return True
