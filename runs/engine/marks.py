"""What a running run records of a step before it ends: write-ahead, step.started, a pending approval, progress.

The same fence as ``runs.engine.steps``: every write is guarded by ``status =
'running' AND lease_token = <mine>`` and writes nothing when the lease is lost.
The statements are in ``runs/sql/marks.sql``.
"""

from __future__ import annotations

from uuid import UUID

from runs.db import engine_cursor, storable_text
from runs.engine.steps import StepRecord
from runs.queries import one, queries


def begin_side_effect(step: StepRecord, *, steps_total: int | None, worker_id: UUID) -> bool:
    """Commit the step as `running` before its side effect. False when the lease is lost."""
    with engine_cursor() as cursor:
        cursor.execute(
            queries.begin_side_effect,
            step.params() | {"steps_total": steps_total, "worker": worker_id},
        )
        return one(cursor) is not None


def announce_step(
    *,
    run_id: UUID,
    token: int,
    seq: int,
    name: str,
    kind: str,
    steps_total: int | None,
    worker_id: UUID,
) -> tuple[bool, bool] | None:
    """Show a slow step as the one in progress (a HOT update, and its step.started Event).

    Returns the run's (cancel requested, pause requested), or None when the lease is lost.
    """
    with engine_cursor() as cursor:
        cursor.execute(
            queries.announce_step,
            {
                "run": run_id,
                "token": token,
                "seq": seq,
                "name": storable_text(name),
                "kind": kind,
                "steps_total": steps_total,
                "worker": worker_id,
            },
        )
        row = one(cursor)
    return None if row is None else (row["cancel"], row["pause"])


def record_pending(step: StepRecord) -> bool:
    """Write a step that waits for a person (an approval), unless it is already pending. False: lease lost."""
    with engine_cursor() as cursor:
        cursor.execute(queries.record_pending, step.params())
        if one(cursor) is not None:
            return True
        cursor.execute(queries.still_held, {"run": step.run_id, "token": step.token})
        return one(cursor) is not None


def record_progress(
    *, run_id: UUID, token: int, message: str, steps_total: int | None, worker_id: UUID
) -> bool:
    """A progress message the agent reported, as a ``progress`` Event. False when the lease is lost."""
    with engine_cursor() as cursor:
        cursor.execute(
            queries.record_progress,
            {
                "run": run_id,
                "token": token,
                "message": storable_text(message)[:2000],
                "steps_total": steps_total,
                "worker": worker_id,
            },
        )
        return one(cursor) is not None
