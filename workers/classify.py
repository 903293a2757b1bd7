"""How a failure raised by step code is handled: retried, failed, or put before a person.

Step code may say it itself by raising ``Retryable``, ``Fatal`` or
``Ambiguous`` (see ``workers.errors``). Otherwise ``classify`` recognises the
exceptions of common HTTP clients and model SDKs by the names of their
classes, so none of them has to be installed:

- connection errors, timeouts, HTTP 408, 409, 425, 429 and 5xx are retryable;
- other 4xx, validation errors and the model's refusals are fatal;
- ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` (``exit()``,
  ``sys.exit(3)``) are fatal: code on a worker's run thread cannot end the
  worker process, which has other runs to carry on with, so the run fails;
- anything else is fatal, and its traceback is kept in the step row.

A ``Retry-After`` (or ``retry-after-ms``) header the callee sent is reported,
so the retry waits at least that long.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

from workers.errors import Ambiguous, StepError

# A callee asking for a longer wait than this is not taken literally; the
# backoff cap applies anyway.
MAX_RETRY_AFTER_SECONDS = 24 * 3600

# Forks and compiled cores that carry the same exception names as the package users know.
_FAMILY = {"httpx2": "httpx", "httpcore2": "httpcore", "pydantic_core": "pydantic"}

# Transport failures that happened before the request left: repeating it is safe.
_NOT_SENT = frozenset(
    {
        "httpx.ConnectError",
        "httpx.ConnectTimeout",
        "httpx.PoolTimeout",
        "httpcore.ConnectError",
        "httpcore.ConnectTimeout",
        "httpcore.PoolTimeout",
        "requests.ConnectTimeout",
        "urllib3.NewConnectionError",
        "urllib3.ConnectTimeoutError",
        "builtins.ConnectionRefusedError",
    }
)

# Transport failures after the request may have reached the callee and had its effect.
_MAYBE_SENT = frozenset(
    {
        "httpx.TimeoutException",
        "httpx.ReadError",
        "httpx.WriteError",
        "httpx.RemoteProtocolError",
        "httpcore.TimeoutException",
        "httpcore.ReadError",
        "httpcore.WriteError",
        "httpcore.RemoteProtocolError",
        "requests.Timeout",
        "requests.ChunkedEncodingError",
        "urllib3.ReadTimeoutError",
        "urllib3.ProtocolError",
        "builtins.TimeoutError",
        "builtins.ConnectionError",
    }
)

# Wrappers whose cause tells whether the request left; without one, assume it may have.
_WRAPPERS = frozenset(
    {
        "openai.APIConnectionError",
        "anthropic.APIConnectionError",
        "requests.ConnectionError",
    }
)

# Errors that carry the callee's HTTP status: the status decides.
_STATUS_ERRORS = frozenset(
    {
        "httpx.HTTPStatusError",
        "requests.HTTPError",
        "openai.APIStatusError",
        "anthropic.APIStatusError",
    }
)

# Failures retrying cannot fix, with what they mean.
_FATAL = {
    "openai.LengthFinishReasonError": "the model stopped at its length limit",
    "openai.ContentFilterFinishReasonError": "the model's answer was withheld by the content filter",
    "pydantic.ValidationError": "data failed validation",
    "builtins.ValueError": "an invalid value",
    "builtins.TypeError": "a call with arguments of the wrong type",
    "builtins.KeyError": "a missing key",
}

RETRYABLE_STATUS_CODES = frozenset({408, 409, 425, 429})

# What would end or interrupt a program, raised by a step or a kind: on a run's thread of a worker it ends the
# run only. A signal to the worker process never arrives as one of these (workers.worker handles SIGINT and
# SIGTERM itself), so one seen here was raised by the run's own code.
INTERRUPTIONS = (SystemExit, KeyboardInterrupt, GeneratorExit)


@dataclass(frozen=True)
class Classification:
    """What the engine does with a failure.

    ``kind`` is ``"retryable"``, ``"fatal"`` or ``"ambiguous"`` (or the kind
    an explicit ``StepError`` subclass declares). ``retry_after`` is how many
    seconds the callee asked us to wait, ``None`` if it did not say.
    ``uncertain`` is True when the call may have reached the callee and had its
    effect (a read timeout, a connection lost after sending, ``Ambiguous``),
    False when it certainly did not. ``reason`` is one readable sentence.
    """

    kind: str
    retry_after: float | None
    uncertain: bool
    status_code: int | None
    reason: str


def classify(exc: BaseException) -> Classification:
    """Classify an exception raised by step code (see the module docstring for the rules)."""
    if isinstance(exc, StepError):
        return Classification(
            kind=exc.error_kind,
            retry_after=exc.retry_after,
            uncertain=isinstance(exc, Ambiguous),
            status_code=None,
            reason=f"the step raised {type(exc).__name__} ({exc.error_kind})",
        )
    if isinstance(exc, INTERRUPTIONS):
        return Classification(
            kind="fatal",
            retry_after=None,
            uncertain=False,
            status_code=None,
            reason=f"{exc!r} cannot stop the worker process; the run fails (fatal)",
        )
    for name in _names(exc):
        if name in _STATUS_ERRORS:
            return _by_status(exc)
        if name in _WRAPPERS:
            cause = _transport_cause(exc)
            return _transport(exc, uncertain=True if cause is None else cause)
        if name in _NOT_SENT or name in _MAYBE_SENT:
            return _transport(exc, uncertain=name in _MAYBE_SENT)
        if name in _FATAL:
            return Classification(
                kind="fatal",
                retry_after=None,
                uncertain=False,
                status_code=None,
                reason=f"{_type_name(exc)}: {_FATAL[name]} (fatal)",
            )
    return Classification(
        kind="fatal",
        retry_after=None,
        uncertain=False,
        status_code=None,
        reason=f"unrecognised exception {_type_name(exc)} (fatal; its traceback is kept in the step row)",
    )


def interruption(exc: BaseException, *, by: str) -> str | None:
    """``SystemExit(3) raised by the step ...``: the run's error for one of ``INTERRUPTIONS``; None for others."""
    if not isinstance(exc, INTERRUPTIONS):
        return None
    return f"{exc!r} raised by {by}: code a worker runs cannot stop the worker process, so the run fails"


def status_kind(status_code: int) -> str:
    """``"retryable"`` for 408, 409, 425, 429 and 5xx; ``"fatal"`` for any other status."""
    if status_code in RETRYABLE_STATUS_CODES or 500 <= status_code <= 599:
        return "retryable"
    return "fatal"


def _names(exc: BaseException):
    """``package.ClassName`` for each class of the exception, most specific first."""
    for cls in type(exc).__mro__:
        package = cls.__module__.partition(".")[0]
        yield f"{_FAMILY.get(package, package)}.{cls.__qualname__}"


def _type_name(exc: BaseException) -> str:
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _transport(exc: BaseException, *, uncertain: bool) -> Classification:
    when = (
        "after the request may have reached the callee"
        if uncertain
        else "before the request reached the callee"
    )
    return Classification(
        kind="retryable",
        retry_after=None,
        uncertain=uncertain,
        status_code=None,
        reason=f"{_type_name(exc)} {when} (retryable)",
    )


def _transport_cause(exc: BaseException) -> bool | None:
    """Whether the nearest recognised transport failure behind a wrapper may have sent the request."""
    seen = {id(exc)}
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        for name in _names(cause):
            if name in _NOT_SENT:
                return False
            if name in _MAYBE_SENT:
                return True
        cause = cause.__cause__ or (None if cause.__suppress_context__ else cause.__context__)
    return None


def _by_status(exc: BaseException) -> Classification:
    response = getattr(exc, "response", None)
    status = getattr(exc, "status_code", None) or getattr(response, "status_code", None)
    retry_after = _retry_after(getattr(response, "headers", None))
    if not isinstance(status, int):
        return Classification(
            kind="fatal",
            retry_after=retry_after,
            uncertain=False,
            status_code=None,
            reason=f"{_type_name(exc)} without a status code (fatal)",
        )
    kind = status_kind(status)
    # A 5xx other than 503 may come after the callee acted (a gateway timed
    # out, the handler crashed half-way); 503 and 4xx mean it did not.
    uncertain = status >= 500 and status != 503
    return Classification(
        kind=kind,
        retry_after=retry_after,
        uncertain=uncertain,
        status_code=status,
        reason=f"HTTP {status} from the callee ({kind})",
    )


def _retry_after(headers) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (delta-seconds or an HTTP-date)."""
    if headers is None:
        return None
    try:
        millis = headers.get("retry-after-ms")
        value = headers.get("retry-after")
    except Exception:  # headers of an unexpected shape: not worth failing the classification
        return None
    seconds = _number(millis)
    if seconds is not None:
        seconds /= 1000
    elif value is not None:
        seconds = _number(value)
        if seconds is None:
            try:
                when = parsedate_to_datetime(str(value))
            except (TypeError, ValueError, IndexError):
                return None
            if when.tzinfo is None:  # "-0000": HTTP-dates are in GMT
                when = when.replace(tzinfo=UTC)
            seconds = max(when.timestamp() - time.time(), 0.0)
    if seconds is None:
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def _number(value) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None
