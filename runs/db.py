"""What every statement of the run domain shares: connections, retries, JSON, status literals, NOTIFY.

The run domain's statements are raw SQL on purpose (``runs.engine`` says
why), each by name with its whole text in ``runs/sql/*.sql``
(``runs.queries``); their status literals come from ``RunStatus`` and
``StepStatus`` through ``sql()``, never from strings typed into the SQL.
The engine's cursor, and what it asks of psycopg beyond its public API, is
``runs.driver``'s.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any, overload

from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, connection, connections

from runs.driver import engine_cursor  # noqa: F401  (the engine's cursor, named here for its callers)
from runs.states import TERMINAL_STATUSES, WEBHOOK_EVENT_TYPES, RunStatus, StepStatus
from runs.text import scrub

logger = logging.getLogger(__name__)

# The one channel of the wake-ups: the payload is a queue name, or "control"
# (a person cancelled or paused a running run: heartbeat now).
NOTIFY_CHANNEL = "agent_runs"
CONTROL_PAYLOAD = "control"

# The NOTIFY channel of live event streams (runs.streams); the payload is the run's id.
EVENTS_CHANNEL = "agent_run_events"

# Status literals for SQL templates: {queued}, {running}, ..., {step_done}, ...,
# {terminal} and {parked} (the states a run waits for people or children in).
PARKED_STATUSES = (RunStatus.WAITING_HUMAN, RunStatus.WAITING, RunStatus.PAUSED)
_LITERALS = (
    {member.name.lower(): f"'{member.value}'" for member in RunStatus}
    | {f"step_{member.name.lower()}": f"'{member.value}'" for member in StepStatus}
    | {
        "terminal": "(" + ", ".join(f"'{s.value}'" for s in sorted(TERMINAL_STATUSES)) + ")",
        "parked": "(" + ", ".join(f"'{s.value}'" for s in PARKED_STATUSES) + ")",
        "live": "("
        + ", ".join(f"'{s.value}'" for s in RunStatus if s not in TERMINAL_STATUSES)
        + ")",
        "webhook_types": "(" + ", ".join(f"'{t}'" for t in WEBHOOK_EVENT_TYPES) + ")",
        "events_channel": EVENTS_CHANNEL,
    }
)


def sql(template: str, **parts: str) -> str:
    """Fill a statement's status literals (and any other named ``parts``); ``%(param)s`` stay as they are."""
    return template.format(**_LITERALS, **parts)


def connection_kwargs() -> dict:
    """psycopg connect() arguments for the default database, for a connection of its own (LISTEN, event streams)."""
    params = connections["default"].get_connection_params()
    # Django's cursor class and adapters are for its own connections.
    for key in ("cursor_factory", "context", "pool"):
        params.pop(key, None)
    # prepare_threshold stays: Django's None (RUNS_DB_PREPARE=0) must hold
    # here too, or psycopg's default (5) prepares statements that a
    # transaction-pooling PgBouncer loses between transactions.
    return params | {"autocommit": True}


def release_connection() -> None:
    """Hand this thread's connection back to the pool, unless a transaction still needs it.

    A run waiting on a model or a tool must hold no connection; called after
    each statement of the worker and the reaper.
    """
    if not connection.in_atomic_block:
        connection.close()


# A lost or broken connection: the statement may or may not have committed.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


# SQLSTATEs of a connection that broke or a server going away, and of the
# transient conflicts a retry resolves (deadlock, serialization failure).
_TRANSIENT_SQLSTATES = ("08", "57P01", "57P02", "57P03", "40P01", "40001")


def is_transient(exc: BaseException) -> bool:
    """A lost connection, a server shutting down or a deadlock: not the statement's fault.

    A timeout or any other error the database raised for the statement
    itself (it would raise it again) is not transient.
    """
    if not isinstance(exc, CONNECTION_ERRORS):
        return False
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    return sqlstate is None or sqlstate.startswith(_TRANSIENT_SQLSTATES)


def refused(exc: BaseException) -> bool:
    """The server answered the statement with an error (a deadlock, a refused value): it did not commit.

    False for a connection lost or ended under it, which may have committed
    before the answer was lost.
    """
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    return sqlstate is not None and not sqlstate.startswith(("08", "57P"))


def with_retries(
    fn, *, attempts: int = 5, for_seconds: float | None = None, what: str = "statement"
):
    """Call ``fn`` again after a lost or broken connection: ``attempts`` times, or for ``for_seconds``.

    For fenced statements only: a retry of one that did commit finds its
    guard no longer matching and changes nothing.
    """
    delay = 0.05
    deadline = None if for_seconds is None else time.monotonic() + for_seconds
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except CONNECTION_ERRORS as exc:
            release_connection()  # a broken connection goes back to the pool to be discarded
            out_of_time = deadline is not None and time.monotonic() + delay > deadline
            if out_of_time or (deadline is None and attempt >= attempts):
                raise
            logger.warning("%s failed (%s); retrying in %.2fs", what, exc.__class__.__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def dumps(value: Any) -> str:
    """JSON text for a jsonb parameter; raises TypeError for what JSON cannot say."""
    return _ENCODER.encode(value)


# One encoder for every call: json.dumps(cls=...) makes a new one each time, which costs a
# worker more than encoding a step's small input or output. Encoders keep no state between calls.
_ENCODER = DjangoJSONEncoder(separators=(",", ":"), allow_nan=False)


def dumps_storable(value: Any) -> tuple[str, bool]:
    """JSON text jsonb accepts, for untrusted data (model and tool output, results).

    NUL characters and lone surrogates, which jsonb refuses, are replaced by
    U+FFFD, and NaN or infinite numbers become null; the flag says whether
    anything was replaced. The fast path is one ``json.dumps``: with
    ``ensure_ascii`` those characters can only appear as ``\\u0000`` and
    ``\\udXXX`` escapes, so most outputs are never walked.
    """
    try:
        text = dumps(value)
    except ValueError:  # NaN or infinity
        text = None
    if text is not None and "\\u0000" not in text and "\\ud" not in text:
        return text, False
    cleaned, replaced = scrub(value)
    return dumps(cleaned), replaced


@overload
def storable_text(text: str) -> str: ...
@overload
def storable_text(text: None) -> None: ...
def storable_text(text: str | None) -> str | None:
    """A text column's value with NUL and lone surrogates replaced by U+FFFD."""
    if text is None:
        return None
    if text.isascii() and "\x00" not in text:  # the common case: no lone surrogate is ASCII
        return text
    cleaned, _ = scrub(text)
    return cleaned


def loads(value: Any) -> Any:
    """jsonb from a raw cursor: Django's connections hand it over undecoded."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def db_now():
    """The database's clock (``statement_timestamp()``), for a time a person's action records."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def notify_queues(queues: set[str] | list[str]) -> None:
    """Wake idle workers listening for these queues (after the change has committed)."""
    with connection.cursor() as cursor:
        for queue in sorted(queues):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue])


def notify_control() -> None:
    """Wake every worker's heartbeat: a person cancelled or paused a running run."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, CONTROL_PAYLOAD])
