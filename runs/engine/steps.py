"""What a running run records of its finished steps, each write one fenced statement (reads: ``steplog``).

A step that has not finished yet (written ahead of its side effect, shown as
started, waiting for an approval) and a progress message: ``runs.engine.marks``.

Every write here is guarded by ``status = 'running' AND lease_token =
<mine>`` on the run row and writes the step, the run's progress and money,
and the Event together, or nothing at all: a worker that lost its lease
records nothing. Money also goes to the tenant's spend of the day (the
daily cost cap reads it in the claim). Step names, inputs, outputs and
errors are untrusted text (models and tools write them): they are made
storable on the way in (``runs.db.dumps_storable``), and the step says so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from runs.db import dumps_storable, engine_cursor, param_rows, sql, storable_text
from runs.events import event_ctes, next_seq
from runs.states import RunStatus


@dataclass
class StepRecord:
    run_id: UUID
    token: int
    generation: int
    seq: int
    name: str
    kind: str
    input: Any
    started_at: datetime
    idempotency_key: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_cents: Decimal = Decimal(0)
    # Set when the step's name, input or output held characters that cannot
    # be stored (NUL, lone surrogates) and were replaced by U+FFFD.
    text_replaced: bool = False
    # A compensation names the step it undoes: its checkpoint marks that one compensated.
    compensates: int | None = None

    def params(self) -> dict[str, Any]:
        """The step's columns as named parameters of the statements below."""
        name = storable_text(self.name)
        input_json, replaced = dumps_storable(self.input)
        self.text_replaced = self.text_replaced or replaced or name != self.name
        return {
            "run": self.run_id,
            "token": self.token,
            "generation": self.generation,
            "seq": self.seq,
            "name": name,
            "kind": self.kind,
            "input": input_json,
            "key": storable_text(self.idempotency_key),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost": self.cost_cents,
            "started_at": self.started_at,
            "text_replaced": self.text_replaced,
            "compensates": self.compensates,
        }


RUN_GUARD = "id = %(run)s AND status = {running} AND lease_token = %(token)s"

# RUN_GUARD of the rows of a statement's parameter table ``p`` (one step or
# exit per row): the runs are found by primary key, always. A prepared
# statement's generic plan cannot know how many rows the arrays hold (it
# guesses 10) and would rather scan every running run through the partial
# index on status, which the statistics may think holds a handful; the
# status compared with a parameter, unlike a literal, cannot pick that index.
BATCH_GUARD = (
    "runs_run.id = ANY(%(run)s::uuid[]) AND runs_run.id = p.run AND runs_run.lease_token = p.token"
    " AND runs_run.status = %(running)s::text"
)

# Every statement that writes several runs locks their rows in one order,
# the primary key's, before it writes them: two such statements over the
# same runs (the heartbeat, the committer's checkpoints and exits, the
# reaper, another worker's committer) then queue one behind the other
# instead of deadlocking. The lock is the UPDATE's own (FOR NO KEY UPDATE),
# so the UPDATE that follows never upgrades it. The same holds of tenant
# rows, also locked in id order.
#
# A transaction of several such statements must lock all its runs in the
# first: the committer's checkpoints and exits commit together, and the
# exits' runs, locked by a second statement, would come after the
# checkpoints' in no order. So the checkpoint locks ``%(lock)s``: its own
# runs and those of the exits that follow it (``checkpoint_many(lock=...)``),
# found by primary key.
LOCK_IN_ORDER = """locked AS (
    SELECT runs_run.id FROM runs_run
    WHERE runs_run.id = ANY(%(lock)s::uuid[])
    ORDER BY runs_run.id
    FOR NO KEY UPDATE
)"""

# Adds the step's cost to the tenant's spend of the day (UTC), only when
# there is a cost: a no-op checkpoint does not touch the row.
_DAILY_COST_CTE = """
d AS (
    INSERT INTO runs_tenantdailycost (tenant_id, day, cost_cents)
    SELECT r.tenant_id, (statement_timestamp() AT TIME ZONE 'UTC')::date, %(cost)s
    FROM r WHERE %(cost)s > 0
    ON CONFLICT (tenant_id, day) DO UPDATE SET cost_cents = runs_tenantdailycost.cost_cents + EXCLUDED.cost_cents
)"""

# What every step Event says of its step: enough for a timeline row.
_STEP_PAYLOAD = (
    "jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'kind', %(kind)s::text,"
    " 'tokens_in', %(tokens_in)s, 'tokens_out', %(tokens_out)s, 'cost_cents', %(cost)s)"
)

STEP_COLUMNS = (
    "run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in, tokens_out,"
    " cost_cents, status, executions, error, text_replaced, started_at"
)

# The checkpoint of one step or of many (each of another run): a worker
# commits the checkpoints of its runs that finished a step at the same time
# in one statement (``checkpoint_many``). One row of ``p`` per step.
_CHECKPOINT_TEMPLATE = """
WITH p AS (
    SELECT * FROM json_to_recordset(%(rows)s::json)
        AS p(run uuid, token bigint, generation int, seq int, name text, kind text, input text, output text, key text,
             tokens_in bigint, tokens_out bigint, cost numeric, started_at timestamptz, text_replaced bool,
             steps_total int)
),
{locked},
r AS (
    UPDATE runs_run SET
        -- A compensation undoes a step: it is not progress.
        steps_done = runs_run.steps_done + (p.kind <> 'compensation')::int,
        steps_total = COALESCE(p.steps_total, runs_run.steps_total),
        current_step = p.name,
        cost_cents = runs_run.cost_cents + p.cost,
        failures = 0,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s),
        heartbeat_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        {next_seq}
    FROM p JOIN locked l ON l.id = p.run
    WHERE {batch_guard} AND runs_run.id = l.id
    RETURNING runs_run.id, runs_run.tenant_id, runs_run.last_event_seq,
              runs_run.cancel_requested_at IS NOT NULL AS cancel, runs_run.pause_requested_at IS NOT NULL AS pause,
              runs_run.cost_cents + runs_run.children_cost_cents AS spent, runs_run.steps_done, runs_run.steps_total,
              p.generation, p.seq, p.name, p.kind, p.input, p.output, p.key, p.tokens_in, p.tokens_out, p.cost,
              p.started_at, p.text_replaced
),
s AS (
    INSERT INTO runs_step ({columns}, ended_at)
    SELECT r.id, r.generation, r.seq, r.name, r.kind, r.input::jsonb, r.output::jsonb,
           r.key, r.tokens_in, r.tokens_out, r.cost, {step_done}, 1, '', r.text_replaced,
           r.started_at, statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        output = EXCLUDED.output, status = {step_done}, error = '',
        tokens_in = runs_step.tokens_in + EXCLUDED.tokens_in,
        tokens_out = runs_step.tokens_out + EXCLUDED.tokens_out,
        cost_cents = runs_step.cost_cents + EXCLUDED.cost_cents,
        -- A write-ahead row already counted this execution when it began; a
        -- sleep, timed wait or gather that ends was one execution all along.
        executions = runs_step.executions + (runs_step.status NOT IN ({step_running}, {step_waiting}))::int,
        text_replaced = runs_step.text_replaced OR EXCLUDED.text_replaced,
        started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
{extra}{events}{daily_cost}
SELECT id, cancel, pause, spent FROM r
"""

# A checkpoint writes only what it has: most steps consume no messages, undo
# nothing, and many cost nothing; each CTE a statement carries costs planning
# and execution even when it touches no row (0.3 ms of a 2 ms no-op
# checkpoint, measured with the statement alone in a loop). The first two
# are for one step at a time (``checkpoint``).
_MESSAGES_CTE = """-- Messages a `message` step read are consumed with its checkpoint (ack
-- after persist): a crash before this statement delivers them again.
m AS (
    UPDATE runs_message SET consumed_by_step_id = s.id
    FROM s
    WHERE runs_message.run_id = (SELECT run FROM p) AND runs_message.id = ANY(%(message_ids)s::bigint[])
      AND runs_message.consumed_by_step_id IS NULL
),
"""

_UNDONE_CTE = """-- A compensation's checkpoint marks the step it undid (runs.engine.saga).
undone AS (
    UPDATE runs_step SET status = {step_compensated}
    WHERE run_id = (SELECT run FROM p) AND generation = (SELECT generation FROM p)
      AND seq = %(compensates)s::int AND status = {step_done} AND EXISTS (SELECT 1 FROM s)
),
"""

# Adds the steps' cost to their tenants' spend of the day (UTC), one row per
# tenant, in tenant order (LOCK_IN_ORDER: two workers' batches write the same
# tenants' rows); only in the statement when a step has a cost.
_BATCH_DAILY_COST_CTE = """
d AS (
    INSERT INTO runs_tenantdailycost (tenant_id, day, cost_cents)
    SELECT r.tenant_id, (statement_timestamp() AT TIME ZONE 'UTC')::date, sum(r.cost)
    FROM r WHERE r.cost > 0 GROUP BY r.tenant_id ORDER BY r.tenant_id
    ON CONFLICT (tenant_id, day) DO UPDATE SET cost_cents = runs_tenantdailycost.cost_cents + EXCLUDED.cost_cents
)"""

_CHECKPOINT_EVENTS = event_ctes(
    "r",
    type="'step.done'",
    actor_type="'worker'",
    actor_id="%(worker)s::text",
    payload=(
        "jsonb_build_object('seq', r.seq, 'name', r.name, 'kind', r.kind,"
        " 'tokens_in', r.tokens_in, 'tokens_out', r.tokens_out, 'cost_cents', r.cost)"
        " || jsonb_build_object('steps_done', r.steps_done, 'steps_total', r.steps_total)"
        " || CASE WHEN cardinality(%(message_ids)s::bigint[]) > 0"
        " THEN jsonb_build_object('messages', to_jsonb(%(message_ids)s::bigint[])) ELSE '{{}}' END"
    ),
)


def _checkpoint_sql(*, messages: bool, undoes: bool, costs: bool) -> str:
    return sql(
        _CHECKPOINT_TEMPLATE,
        extra=sql((_MESSAGES_CTE if messages else "") + (_UNDONE_CTE if undoes else "")),
        next_seq=next_seq(),
        columns=STEP_COLUMNS,
        batch_guard=BATCH_GUARD,
        locked=LOCK_IN_ORDER,
        daily_cost=",\n" + _BATCH_DAILY_COST_CTE if costs else "",
        events=_CHECKPOINT_EVENTS,
    )


_CHECKPOINT_SQL = {
    (messages, undoes, costs): _checkpoint_sql(messages=messages, undoes=undoes, costs=costs)
    for messages in (False, True)
    for undoes in (False, True)
    for costs in (False, True)
}

# A checkpoint's answer: (cancel requested, pause requested, run cost, the output as stored, in JSON).
Checkpointed = tuple[bool, bool, Decimal, str]


@dataclass
class Checkpoint:
    """A finished step to record: ``checkpoint_many`` takes several, of different runs."""

    step: StepRecord
    output: Any
    steps_total: int | None = None
    # Set by prepare(): the output as stored, and the step's parameters.
    output_json: str = ""
    row: dict[str, Any] | None = None

    def prepare(self) -> Checkpoint:
        """Make the output storable; raises TypeError when it is not JSON (then nothing can be written)."""
        if self.row is None:
            self.output_json, replaced = dumps_storable(self.output)
            self.step.text_replaced = self.step.text_replaced or replaced
            self.row = self.step.params() | {
                "output": self.output_json,
                "steps_total": self.steps_total,
            }
        return self


_ROW_PARAMS = (
    "run",
    "token",
    "generation",
    "seq",
    "name",
    "kind",
    "input",
    "output",
    "key",
    "tokens_in",
    "tokens_out",
    "cost",
    "started_at",
    "text_replaced",
    "steps_total",
)


def _execute_checkpoints(
    statement_key, rows: list[dict[str, Any]], scalars: dict[str, Any], lock: Iterable[UUID] = ()
) -> dict[UUID, tuple]:
    runs = [row["run"] for row in rows]
    params = {
        "rows": param_rows(rows, _ROW_PARAMS),
        "run": runs,
        "lock": list({*runs, *lock}),
        "running": RunStatus.RUNNING,
    }
    params |= scalars
    with engine_cursor() as cursor:
        cursor.execute(_CHECKPOINT_SQL[statement_key], params)
        return {row[0]: row[1:] for row in cursor.fetchall()}


def checkpoint(
    step: StepRecord,
    *,
    output: Any,
    worker_id: UUID,
    lease: float,
    steps_total: int | None,
    consumed_message_ids: list[int] | None = None,
) -> Checkpointed | None:
    """Record a finished step with the run's progress, cost and lease extension, in one statement.

    ``output`` is made storable first (raises TypeError when it is not
    JSON). Returns (cancel requested, pause requested, run cost, the output
    as stored, in JSON) or None when the lease is lost, in which case nothing
    at all was written. The run's cost includes what its finished children spent.
    """
    item = Checkpoint(step=step, output=output, steps_total=steps_total).prepare()
    key = (bool(consumed_message_ids), step.compensates is not None, step.cost_cents > 0)
    found = _execute_checkpoints(
        key,
        [item.row],
        {
            "lease": lease,
            "worker": worker_id,
            "message_ids": consumed_message_ids or [],
            "compensates": step.compensates,
        },
    )
    answer = found.get(step.run_id)
    return None if answer is None else (*answer, item.output_json)


def checkpoint_many(
    items: list[Checkpoint], *, worker_id: UUID, lease: float, lock: Iterable[UUID] = ()
) -> list[Checkpointed | None]:
    """Record finished steps of different runs, in one statement: what ``checkpoint`` does for each.

    For steps that consume no messages and undo nothing (``checkpoint``
    does those); an output that is not JSON raises TypeError before
    anything is written (``Checkpoint.prepare`` finds it first). The
    answers are in the items' order, None for a run whose lease is lost
    (nothing of it was written; the others are).

    ``lock`` names other runs the caller's transaction writes next (the
    exits the committer commits with these checkpoints): their rows are
    locked with the steps' runs, all in id order (``LOCK_IN_ORDER``).
    """
    rows = [item.prepare().row for item in items]
    if len({item.step.run_id for item in items}) != len(items):
        raise ValueError("checkpoint_many takes one step per run")
    if any(item.step.compensates is not None for item in items):
        raise ValueError("a compensation is checkpointed alone (checkpoint)")
    costs = any(item.step.cost_cents > 0 for item in items)
    found = _execute_checkpoints(
        (False, False, costs),
        rows,
        {
            "lease": lease,
            "worker": worker_id,
            "message_ids": [],
            "compensates": None,
        },
        lock,
    )
    answers: list[Checkpointed | None] = []
    for item in items:
        answer = found.get(item.step.run_id)
        answers.append(None if answer is None else (*answer, item.output_json))
    return answers


_STEP_FAILED_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET
        cost_cents = cost_cents + %(cost)s,
        current_step = %(name)s,
        updated_at = statement_timestamp(),
        {next_seq}
    WHERE {guard}
    RETURNING id, tenant_id, last_event_seq, attempt, cost_cents + children_cost_cents AS spent
),
s AS (
    INSERT INTO runs_step ({columns}, ended_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb, NULL, %(key)s,
           %(tokens_in)s, %(tokens_out)s, %(cost)s, %(status)s, 1, %(error)s, %(text_replaced)s,
           %(started_at)s, statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        status = EXCLUDED.status, error = EXCLUDED.error,
        tokens_in = runs_step.tokens_in + EXCLUDED.tokens_in,
        tokens_out = runs_step.tokens_out + EXCLUDED.tokens_out,
        cost_cents = runs_step.cost_cents + EXCLUDED.cost_cents,
        executions = runs_step.executions + (runs_step.status <> {step_running})::int,
        text_replaced = runs_step.text_replaced OR EXCLUDED.text_replaced,
        started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
a AS (
    INSERT INTO runs_stepattempt (step_id, run_id, attempt, error, error_kind, tokens_in, tokens_out,
                                  cost_cents, worker, started_at, ended_at)
    SELECT s.id, r.id, r.attempt, %(error)s, %(error_kind)s, %(tokens_in)s, %(tokens_out)s, %(cost)s,
           %(worker)s, %(started_at)s, statement_timestamp()
    FROM r, s
),
{events},
{daily_cost}
SELECT spent FROM r
""",
    next_seq=next_seq(),
    guard=sql(RUN_GUARD),
    columns=STEP_COLUMNS,
    daily_cost=_DAILY_COST_CTE,
    events=event_ctes(
        "r",
        type="'step.failed'",
        actor_type="'worker'",
        actor_id="%(worker)s::text",
        payload=_STEP_PAYLOAD
        + (
            " || jsonb_build_object('status', %(status)s::text, 'error_kind', %(error_kind)s::text,"
            " 'error', left(%(error)s, 500))"
        ),
    ),
)


def record_step_failure(
    step: StepRecord, *, error: str, error_kind: str, worker_id: UUID, status: str = "failed"
) -> Decimal | None:
    """Record a failed execution (Step row, StepAttempt, Event, cost).

    ``status`` is ``failed``, or ``waiting`` for an ambiguous side effect a
    person must decide. Returns the run's cost, or None when the lease is lost.
    """
    error_text = storable_text(error) or ""
    step.text_replaced = step.text_replaced or error_text != error
    with engine_cursor() as cursor:
        cursor.execute(
            _STEP_FAILED_SQL,
            step.params()
            | {
                "error": error_text,
                "error_kind": error_kind,
                "worker": worker_id,
                "status": status,
            },
        )
        row = cursor.fetchone()
    return None if row is None else row[0]
