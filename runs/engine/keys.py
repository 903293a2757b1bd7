"""Concurrency keys: at most one active run per key of a tenant ("one live run per lead").

A run submitted with ``concurrency_key`` while another run of that key is
live (queued, running, parked) is *held*: it waits, status ``waiting`` and
never started, never claimed, until every run of the key before it has
ended; then ``release`` queues the oldest held one. What the submit does
when the key is taken is its ``on_conflict`` (``runs.services``):
``enqueue`` (held), ``reject`` (``ConcurrencyKeyTaken``, 409 naming the live
run), ``cancel_running`` and ``cancel_running_with_rollback`` (the live
runs are cancelled, a running one at its next step boundary, with or
without rolling back its finished steps, and the new run is held until
they have ended).

Every decision that makes a run of a key active (a submit, a release, a
person's retry) takes the key's lock first (``lock``, an advisory
transaction lock) and then reads the key's runs, so that two of them never
both see the key free. The partial unique index ``run_one_active_per_key``
holds the rule in the database as well: under any interleaving at most one
run of a key is active, so at most one runs.

A run that ends does not take the key's lock in its own transaction (the
exit from running is one statement, and its row is locked before any key
lock could be): the release follows its commit (``release_after_commit``),
in a transaction of its own. If the process dies in between, the reaper's
pass (``release_stuck``) releases the key; nothing stays held for longer
than a reaper interval.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from runs.exceptions import InvalidTransition
from runs.notify import count_and_notify_after_commit
from runs.queries import one, queries, rows

logger = logging.getLogger(__name__)

ON_CONFLICT = ("enqueue", "reject", "cancel_running", "cancel_running_with_rollback")


class ConcurrencyKeyTaken(InvalidTransition):
    """The key is held by a live run and the submit said ``on_conflict="reject"`` (409)."""

    def __init__(self, message: str, *, run_id: UUID):
        super().__init__(message)
        self.run_id = run_id


@dataclass(frozen=True)
class KeyRun:
    id: UUID
    status: str
    held: bool  # waiting its turn behind another run of the key


def lock(tenant_id: Any, key: str) -> None:
    """Take the key's lock until the transaction ends (inside ``transaction.atomic`` only)."""
    if not connection.in_atomic_block:
        raise RuntimeError("a concurrency key is locked inside a transaction")
    with connection.cursor() as cursor:
        cursor.execute(queries.lock_key, {"tenant": str(tenant_id), "key": key})


def live_runs(tenant_id: Any, key: str) -> list[KeyRun]:
    """The key's live runs, oldest first (read after ``lock``, they stay true until the commit)."""
    with connection.cursor() as cursor:
        cursor.execute(queries.key_runs, {"tenant": tenant_id, "key": key})
        return [KeyRun(**row) for row in rows(cursor)]


def release(tenant_id: Any, key: str) -> UUID | None:
    """Queue the key's oldest held run if no run of the key is active; its id, or None."""
    with transaction.atomic():
        lock(tenant_id, key)
        with connection.cursor() as cursor:
            cursor.execute(queries.release_key, {"tenant": tenant_id, "key": key})
            row = one(cursor)
        if row is None:
            return None
        count_and_notify_after_commit(tenant_id=row["tenant_id"], queue=row["queue"])
        return row["id"]


def release_after_commit(tenant_id: Any, key: str) -> None:
    """Once the transaction that ended a run of ``key`` commits, release the key (the reaper if this fails)."""

    def go() -> None:
        try:
            release(tenant_id, key)
        except Exception:
            logger.exception("could not release concurrency key %r (the reaper will)", key)

    transaction.on_commit(go)


def release_stuck(*, batch: int) -> int:
    """The reaper's pass: release keys whose held runs wait behind no active run; returns how many moved."""
    with connection.cursor() as cursor:
        cursor.execute(queries.stuck_keys, {"batch": batch})
        stuck = rows(cursor)
    return sum(1 for row in stuck if release(row["tenant_id"], row["key"]) is not None)
