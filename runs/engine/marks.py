"""What a running run records of a step before it ends: write-ahead, step.started, a pending approval, progress.

The same fence as ``runs.engine.steps``: every write is guarded by ``status =
'running' AND lease_token = <mine>`` and writes nothing when the lease is lost.
"""

from __future__ import annotations

from uuid import UUID

from runs.db import engine_cursor, sql, storable_text
from runs.engine.steps import RUN_GUARD, STEP_COLUMNS, StepRecord
from runs.events import event_ctes, next_seq

# A step shown as started: one written ahead of its side effect, or one still
# running after ANNOUNCE_AFTER_SECONDS (a fast step gets only its step.done).
_STARTED_EVENTS = event_ctes(
    "r",
    type="'step.started'",
    actor_type="'worker'",
    actor_id="%(worker)s::text",
    payload=(
        "jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'kind', %(kind)s::text,"
        " 'steps_done', r.steps_done, 'steps_total', r.steps_total)"
    ),
)


# Write-ahead for side effects: the Step row is committed as `running` before
# the effect, so that a crash leaves a record that the effect may have
# happened. Re-executing a keyed step counts one more execution.
_BEGIN_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, steps_total = COALESCE(%(steps_total)s, steps_total),
        {next_seq}
    WHERE {guard}
    RETURNING id, last_event_seq, steps_done, steps_total
),
s AS (
    INSERT INTO runs_step ({columns})
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb, NULL, %(key)s,
           0, 0, 0, {step_running}, 1, '', %(text_replaced)s, %(started_at)s
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        status = {step_running}, executions = runs_step.executions + 1, started_at = EXCLUDED.started_at,
        idempotency_key = EXCLUDED.idempotency_key, ended_at = NULL
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
{events}
SELECT 1 FROM r
""",
    guard=sql(RUN_GUARD),
    columns=STEP_COLUMNS,
    next_seq=next_seq(),
    events=_STARTED_EVENTS,
)


def begin_side_effect(step: StepRecord, *, steps_total: int | None, worker_id: UUID) -> bool:
    """Commit the step as `running` before its side effect. False when the lease is lost."""
    with engine_cursor() as cursor:
        cursor.execute(
            _BEGIN_SQL, step.params() | {"steps_total": steps_total, "worker": worker_id}
        )
        return cursor.fetchone() is not None


_ANNOUNCE_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, steps_total = COALESCE(%(steps_total)s, steps_total),
        {next_seq}
    WHERE {guard}
    RETURNING id, last_event_seq, steps_done, steps_total,
              cancel_requested_at IS NOT NULL AS cancel, pause_requested_at IS NOT NULL AS pause
),
{events}
SELECT cancel, pause FROM r
""",
    guard=sql(RUN_GUARD),
    next_seq=next_seq(),
    events=_STARTED_EVENTS,
)


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
            _ANNOUNCE_SQL,
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
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


# The pending approval and its Event, once: a replay that parks again on the
# same pending step writes neither (the step exists, so the run row is not
# touched and no seq is taken).
_AWAIT_SQL = sql(
    """
WITH fresh AS (
    SELECT NOT EXISTS (SELECT 1 FROM runs_step
                       WHERE run_id = %(run)s AND generation = %(generation)s AND seq = %(seq)s) AS yes
),
r AS (
    UPDATE runs_run SET current_step = %(name)s, {next_seq}
    FROM fresh
    WHERE {guard} AND fresh.yes
    RETURNING id, last_event_seq
),
s AS (
    INSERT INTO runs_step ({columns})
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb, NULL, '',
           0, 0, 0, {step_waiting}, 1, '', %(text_replaced)s, %(started_at)s
    FROM r
    ON CONFLICT (run_id, generation, seq) DO NOTHING
    RETURNING id
),
{events}
SELECT 1 FROM s
""",
    guard=sql(RUN_GUARD),
    columns=STEP_COLUMNS,
    next_seq=next_seq(),
    events=event_ctes(
        "r",
        type="'approval.requested'",
        actor_type="'worker'",
        actor_id="''",
        payload="jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'proposal', %(input)s::jsonb -> 'proposal')",
    ),
)

_STILL_HELD_SQL = sql("SELECT 1 FROM runs_run WHERE {guard}", guard=sql(RUN_GUARD))


def record_pending(step: StepRecord) -> bool:
    """Write a step that waits for a person (an approval), unless it is already pending. False: lease lost."""
    with engine_cursor() as cursor:
        cursor.execute(_AWAIT_SQL, step.params())
        if cursor.fetchone() is not None:
            return True
        cursor.execute(_STILL_HELD_SQL, {"run": step.run_id, "token": step.token})
        return cursor.fetchone() is not None


_PROGRESS_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET steps_total = COALESCE(%(steps_total)s, steps_total), {next_seq}
    WHERE {guard}
    RETURNING id, last_event_seq, steps_done, steps_total, current_step
),
{events}
SELECT 1 FROM r
""",
    guard=sql(RUN_GUARD),
    next_seq=next_seq(),
    events=event_ctes(
        "r",
        type="'progress'",
        actor_type="'worker'",
        actor_id="%(worker)s::text",
        payload=(
            "jsonb_build_object('message', %(message)s::text, 'steps_done', r.steps_done,"
            " 'steps_total', r.steps_total, 'current_step', r.current_step)"
        ),
    ),
)


def record_progress(
    *, run_id: UUID, token: int, message: str, steps_total: int | None, worker_id: UUID
) -> bool:
    """A progress message the agent reported, as a ``progress`` Event. False when the lease is lost."""
    with engine_cursor() as cursor:
        cursor.execute(
            _PROGRESS_SQL,
            {
                "run": run_id,
                "token": token,
                "message": storable_text(message)[:2000],
                "steps_total": steps_total,
                "worker": worker_id,
            },
        )
        return cursor.fetchone() is not None
