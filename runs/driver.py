"""What the run domain asks of psycopg beyond its public API, in one place, behind a version check.

One name only: ``psycopg._queries``' limits on which statements have their
placeholder conversion cached (``MAX_CACHED_STATEMENT_LENGTH`` and
``MAX_CACHED_STATEMENT_PARAMS``, 4096 characters and 50 parameters). The
claim and the exit are longer and a submit's insert has more parameters,
and converting them again on every execution cost a worker and a submit
more CPU than anything else of theirs. They are a fixed handful: let them be
cached. The names exist, with that meaning, from psycopg 3.1.11 (where the
limits came in) through 3.3 (read in 3.3.9's ``_queries.py``); with any
other version nothing private is touched, one warning is logged, and the
statements are converted at every execution, as psycopg does by default.

The engine's cursor (``engine_cursor``) needs nothing private: a server-side
binding ``psycopg.Cursor`` on Django's connection, wrapped as
``connection.cursor()`` wraps its own, through the connection's public
``make_cursor`` and ``make_debug_cursor``.

Nothing else in ``runs/``, ``workers/`` or ``config/`` names a private
psycopg module or attribute (tests/runs/test_driver.py checks it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.utils import CursorWrapper

logger = logging.getLogger(__name__)

# [first, past): the psycopg versions whose _queries has the two limits.
CACHE_LIMITS_KNOWN = ((3, 1, 11), (3, 4))

STATEMENT_LENGTH = 16384
STATEMENT_PARAMS = 200

_warned = False


def psycopg_version(text: str = psycopg.__version__) -> tuple[int, ...]:
    """``"3.3.9"`` as ``(3, 3, 9)``; a suffix (``3.4.0.dev1``) ends the number."""
    numbers = []
    for part in text.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() < len(part):
            break
    return tuple(numbers)


def cache_limits_known(version: tuple[int, ...]) -> bool:
    first, past = CACHE_LIMITS_KNOWN
    return first <= version < past


def raise_cache_limits(version: tuple[int, ...] | None = None) -> bool:
    """Let psycopg cache the conversion of the engine's long statements; False (and one warning) if it cannot.

    ``version`` is the installed psycopg's unless given (tests give another).
    Only raised, never lowered: a limit already higher stays.
    """
    global _warned
    version = psycopg_version() if version is None else version
    if not cache_limits_known(version):
        if not _warned:
            _warned = True
            logger.warning(
                "psycopg %s is outside the versions whose statement cache limits are known (%s to before %s): "
                "long statements are parsed again at every execution",
                ".".join(map(str, version)),
                ".".join(map(str, CACHE_LIMITS_KNOWN[0])),
                ".".join(map(str, CACHE_LIMITS_KNOWN[1])),
            )
        return False
    from psycopg import _queries as queries

    if getattr(queries, "MAX_CACHED_STATEMENT_LENGTH", 0) < STATEMENT_LENGTH:
        queries.MAX_CACHED_STATEMENT_LENGTH = STATEMENT_LENGTH
    if getattr(queries, "MAX_CACHED_STATEMENT_PARAMS", 0) < STATEMENT_PARAMS:
        queries.MAX_CACHED_STATEMENT_PARAMS = STATEMENT_PARAMS
    return True


@contextmanager
def engine_cursor() -> Iterator[CursorWrapper]:
    """A cursor for the engine's own statements, on this thread's Django connection (its transaction).

    Django's cursors bind parameters on the client: every execution sends
    the statement's text, to be parsed and planned again, and the claim,
    checkpoint and exit statements cost more to plan than to run. This one
    binds them on the server, so that ``prepare_threshold`` (``RUNS_DB_PREPARE``)
    prepares each statement once per connection; behind a transaction
    pooler without prepared statements it still sends parameters apart
    (unnamed statements). Parameters are typed by their Python values: a
    ``None`` whose type the statement does not fix needs a cast there.
    Otherwise it is what ``connection.cursor()`` gives: Django's errors,
    execute wrappers and query log.
    """
    # This thread's connection, looked up once (the ``connection`` proxy looks it up at every attribute).
    db = connections[DEFAULT_DB_ALIAS]
    db.ensure_connection()
    db.validate_thread_sharing()
    with db.wrap_database_errors:
        raw = psycopg.Cursor(db.connection, row_factory=dict_rows)
    # django-stubs type the argument of make_cursor and make_debug_cursor as a CursorWrapper;
    # Django's own cursor() hands them the DB-API cursor (create_cursor's), as here.
    cursor: CursorWrapper
    if db.queries_logged:
        cursor = db.make_debug_cursor(raw)  # type: ignore[arg-type]
    else:
        cursor = db.make_cursor(raw)  # type: ignore[arg-type]
    try:
        yield cursor
    finally:
        cursor.close()


def dict_rows(cursor: psycopg.Cursor) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """The engine cursor's row factory: each row a dict keyed by column name (``runs.queries.one``, ``rows``).

    psycopg's ``dict_row`` less its lookup of the connection's encoding at
    every result: the names are decoded as UTF-8, the client encoding Django
    sets on every connection.
    """
    result = cursor.pgresult
    names = (
        [] if result is None else [(result.fname(i) or b"").decode() for i in range(result.nfields)]
    )

    def make(values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(names, values, strict=True))

    return make
