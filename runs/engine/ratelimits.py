"""Rate limits on what runs share (a model provider): requests and tokens per minute, across workers.

A limit (``RateLimit``: ``requests_per_minute``, ``tokens_per_minute``,
``per_tenant_share``) is a row in PostgreSQL; every call under it is a
``RateReservation`` written before the call is sent (``reserve``), under the
limit's row lock, only if the last 60 seconds leave room for it: one more
request, and its estimated tokens (for a model call, the prompt's estimate
plus its output cap). The call's reported usage replaces the estimate once
it answers (``settle``), and the reservation then counts from that moment,
never earlier than the call reached the provider; a call in flight counts
whatever its age. Since every reservation checks the 60 seconds before it,
no 60-second window of the provider's own clock ever holds more than the
limit.

When there is no room, ``reserve`` says when there will be (``Denied.until``:
when enough of the window's reservations will have left it, or the end of a
pause); the worker then gives the run back to the queue until that moment
(``workers.errors.AwaitCapacity``), holding no worker slot and no connection.
A provider's 429 with ``Retry-After`` pauses the key for every worker
(``pause``). The reaper deletes reservations older than any window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from runs.queries import one, queries, rows

WINDOW = timedelta(seconds=60)
_AFTER = timedelta(milliseconds=10)  # the moment a reservation has left the window, and a little
SETTLE_RETRY = timedelta(
    seconds=1
)  # a call denied while others are in flight looks again this soon


class NeverEnough(ValueError):
    """A call that needs more than the limit allows in a whole minute: no wait makes room for it."""


@dataclass(frozen=True)
class Reserved:
    id: int | None  # None: no limit applies
    key: str | None


@dataclass(frozen=True)
class Denied:
    key: str
    until: datetime  # the database's clock
    why: str  # "paused", "requests", "tokens", or the tenant share's


def reserve(keys: list[str], *, tenant_id: Any, run_id: Any, tokens: int) -> Reserved | Denied:
    """Reserve one call of ``tokens`` estimated tokens under the first of ``keys`` that exists."""
    with connection.cursor() as cursor:
        cursor.execute(queries.rate_limit_key, {"keys": keys})
        found = one(cursor)
    if found is None:
        return Reserved(id=None, key=None)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries.lock_rate_limit, {"key": found["key"]})
        limit = one(cursor)
        if limit is None:  # deleted since: the call is under no limit
            return Reserved(id=None, key=None)
        key, now = limit["key"], limit["now"]
        if limit["paused_until"] is not None and limit["paused_until"] > now:
            return Denied(key=key, until=limit["paused_until"], why="paused")
        bounds = _bounds(limit)
        for what, (_requests, allowed_tokens) in bounds.items():
            if allowed_tokens is not None and tokens > allowed_tokens:
                raise NeverEnough(
                    f"a call of up to {tokens} tokens (the prompt's estimate and the output cap) "
                    f"is more than rate limit {key!r} allows {what} in a minute ({allowed_tokens}): "
                    "lower the output cap (LLM_MAX_OUTPUT_TOKENS) or raise the limit"
                )
        params = {"key": key, "tenant": tenant_id, "now": now}
        cursor.execute(queries.rate_window, params)
        window = one(cursor) or {}
        used = {
            "in all": (window.get("requests", 0), window.get("tokens", 0)),
            "to one tenant": (window.get("my_requests", 0), window.get("my_tokens", 0)),
        }
        short = [
            what
            for what, (max_requests, max_tokens) in bounds.items()
            if (max_requests is not None and used[what][0] + 1 > max_requests)
            or (max_tokens is not None and used[what][1] + tokens > max_tokens)
        ]
        if short:
            cursor.execute(queries.rate_window_rows, params)
            window_rows = rows(cursor)
            until = _room_at(window_rows, bounds, tokens, now)
            if any(not row["settled"] for row in window_rows):
                # Calls in flight reserved their output cap; their usage, settled when they
                # answer, usually frees most of it long before their reservations leave.
                until = min(until, now + SETTLE_RETRY)
            return Denied(key=key, until=until, why=", ".join(short))
        cursor.execute(queries.reserve_rate, params | {"run": run_id, "tokens": tokens})
        reserved = one(cursor)
        assert reserved is not None
        return Reserved(id=reserved["id"], key=key)


def _bounds(limit: dict) -> dict[str, tuple[int | None, int | None]]:
    """(requests, tokens) allowed per minute, in all and to one tenant (its share)."""
    rpm, tpm, share = (
        limit["requests_per_minute"],
        limit["tokens_per_minute"],
        limit["per_tenant_share"],
    )
    bounds = {"in all": (rpm, tpm)}
    if share is not None:
        bounds["to one tenant"] = (
            max(1, math.floor(rpm * share)) if rpm is not None else None,
            max(1, math.floor(tpm * share)) if tpm is not None else None,
        )
    return bounds


def _room_at(
    window: list[dict], bounds: dict[str, tuple[int | None, int | None]], tokens: int, now: datetime
) -> datetime:
    """When enough of the window's reservations (oldest first) will have left it for this call."""
    until = now
    for what, (max_requests, max_tokens) in bounds.items():
        mine = what == "to one tenant"
        held = [row for row in window if row["mine"] or not mine]
        count, total = len(held), sum(row["tokens"] for row in held)
        for row in held:  # leaving oldest first, until what is left fits
            fits_requests = max_requests is None or count + 1 <= max_requests
            fits_tokens = max_tokens is None or total + tokens <= max_tokens
            if fits_requests and fits_tokens:
                break
            count, total = count - 1, total - row["tokens"]
            until = max(until, row["at"] + WINDOW + _AFTER)
    return until


def settle(reservation_id: int | None, *, tokens: int) -> None:
    """The call answered: its reported usage replaces the estimate."""
    if reservation_id is None:
        return
    with connection.cursor() as cursor:
        cursor.execute(queries.settle_rate, {"id": reservation_id, "tokens": max(0, tokens)})


def pause(key: str, *, seconds: float) -> datetime | None:
    """The provider said to wait (429, Retry-After): every worker's calls under ``key`` wait; until when."""
    with connection.cursor() as cursor:
        cursor.execute(queries.pause_rate_limit, {"key": key, "seconds": max(0.0, seconds)})
        row = one(cursor)
    return row["paused_until"] if row else None


def prune() -> int:
    """Delete reservations older than any window; how many."""
    with connection.cursor() as cursor:
        cursor.execute(queries.prune_rate_reservations)
        return cursor.rowcount


def set_limit(
    key: str,
    *,
    requests_per_minute: int | None,
    tokens_per_minute: int | None,
    per_tenant_share: float | None = None,
) -> Any:
    """Create or change the limit ``key`` (idempotent); ValueError for a value it cannot mean."""
    from runs.models import RateLimit

    if not key or len(key) > 200:
        raise ValueError("a rate limit's key is 1 to 200 characters")
    for name, value in (
        ("requests_per_minute", requests_per_minute),
        ("tokens_per_minute", tokens_per_minute),
    ):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} is a whole number of at least 1, not {value}")
    if requests_per_minute is None and tokens_per_minute is None:
        raise ValueError("give requests_per_minute, tokens_per_minute or both")
    if per_tenant_share is not None and not 0 < per_tenant_share <= 1:
        raise ValueError(f"per_tenant_share is more than 0 and at most 1, not {per_tenant_share}")
    limit, _ = RateLimit.objects.update_or_create(
        key=key,
        defaults={
            "requests_per_minute": requests_per_minute,
            "tokens_per_minute": tokens_per_minute,
            "per_tenant_share": per_tenant_share,
        },
    )
    return limit
