"""What the layers below conversations need of them: a turn's thread locked first, and a turn's end told.

Conversations (``runs.threads``) sit above the control layer and the
engine: they start, hold and queue turns through ``runs.control``. Two
things go the other way, and pass through here so that nothing below
imports them: every change of a turn's status takes its thread's lock
first (``lock_thread_of``, the lock order of conversations), and a turn
that becomes terminal tells its thread in the same transaction
(``tell_turn_ended``, which calls what ``runs.threads.turns`` registers
when it loads; ``RunsConfig.ready`` loads it in every process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from uuid import UUID

from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from runs.events import Actor
from runs.queries import one, queries

_turn_ended: Callable[..., None] | None = None


def lock_thread_of(run_id: Any) -> UUID | None:
    """Lock the thread of run ``run_id`` if it is a turn (before the run: the lock order); its id, or None."""
    with connection.cursor() as cursor:
        cursor.execute(queries.lock_thread_of_run, {"run": run_id})
        row = one(cursor)
    return row["id"] if row else None


def on_turn_ended(fn: Callable[..., None]) -> Callable[..., None]:
    """Register what a turn's end does to its thread (``runs.threads.turns.turn_ended``)."""
    global _turn_ended
    _turn_ended = fn
    return fn


def tell_turn_ended(run_id: Any, *, actor: Actor) -> None:
    """Turn ``run_id`` just became terminal, in this transaction, its thread locked first: tell its thread."""
    if _turn_ended is None:
        raise ImproperlyConfigured("runs.threads.turns is not loaded (RunsConfig.ready loads it)")
    _turn_ended(run_id, actor=actor)
