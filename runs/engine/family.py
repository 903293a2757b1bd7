"""Parents and their child runs (README.md, "Workflows"): gathering children, and the wake-up no child can lose.

A parent gathers children in two steps, each under its own row's lock:
``begin_gather`` reads the children and, when not enough have finished,
writes the gather step as ``waiting`` with the ids still ``pending`` and the
counters (``children_pending``, ``children_needed``) on the run; then the
run's exit parks it in ``waiting``, re-checking the counters under the same
lock (``leave_running(recheck=True)``), so a child that finished in between
sends it back to the queue instead.

A child's terminal transition, in its own transaction, locks the parent's
row and then (``child_finished``, a statement with a fresh snapshot) takes
itself off the gather step's pending list, at most once, decrements the
counters, adds what the finished children spent to the parent's, and
queues the parent when the gather's condition is met. Lock order is the
child's row, then the parent's: a child's transition holds its own row
while it waits for its parent's, so nothing that holds a parent's row
waits for a child's (a parent cancels its children after its own
transition commits: ``live_children``). The one exception is a worker's
heartbeat, which extends the leases of all the runs it holds in one
statement, a parent and its child among them: the rare deadlock with a
child's exit is detected by PostgreSQL and the exit is retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from runs.db import dumps, loads, notify_queues, sql
from runs.engine.steps import RUN_GUARD
from runs.events import event_ctes, next_seq
from runs.states import TERMINAL_STATUSES


def lock_run(run_id: UUID) -> None:
    """Lock a run's row until the transaction ends (a parent's, before its child's transition decides)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run_id])


# The wake condition of a gather, on the counters after this child: every
# awaited child finished; or (min_success) enough succeeded, or too few are
# left to get there; or the finished children spent the parent's budget.
_WAKE = """(
    {pending} = 0
    OR ({needed} IS NOT NULL AND ({needed} = 0 OR {pending} < {needed}))
    OR (p.cost_ceiling_cents IS NOT NULL AND p.cost_cents + {children_cost} > p.cost_ceiling_cents)
)"""

_CHILD_FINISHED_SQL = sql(
    """
WITH awaited AS (
    -- This child off its parent's pending list, at most once per gather.
    UPDATE runs_step s SET output = jsonb_set(s.output, '{{pending}}', (s.output -> 'pending') - %(child)s::text)
    FROM runs_run p
    WHERE p.id = %(parent)s AND s.run_id = p.id AND s.generation = p.generation
      AND s.kind = 'child' AND s.status = {step_waiting} AND (s.output -> 'pending') ? %(child)s::text
    RETURNING s.id
),
counted AS (
    SELECT p.id,
           CASE WHEN a.hit THEN GREATEST(p.children_pending - 1, 0) ELSE p.children_pending END AS pending,
           CASE WHEN a.hit AND p.children_needed IS NOT NULL
                THEN GREATEST(p.children_needed - %(succeeded)s::int, 0) ELSE p.children_needed END AS needed,
           (SELECT COALESCE(sum(c.cost_cents + c.children_cost_cents), 0) FROM runs_run c
            WHERE c.parent_id = p.id AND c.status IN {terminal}) AS children_cost,
           a.hit
    FROM runs_run p, (SELECT EXISTS (SELECT 1 FROM awaited) AS hit) a
    WHERE p.id = %(parent)s
),
decided AS (
    SELECT c.*, p.status = {waiting} AND p.children_pending > 0 AND c.hit AND """
    + _WAKE.format(pending="c.pending", needed="c.needed", children_cost="c.children_cost")
    + """ AS wake
    FROM counted c JOIN runs_run p ON p.id = c.id
),
r AS (
    UPDATE runs_run p SET
        children_pending = d.pending, children_needed = d.needed, children_cost_cents = d.children_cost,
        status = CASE WHEN d.wake THEN {queued} ELSE p.status END,
        run_after = CASE WHEN d.wake THEN statement_timestamp() ELSE p.run_after END,
        wake_at = CASE WHEN d.wake THEN NULL ELSE p.wake_at END,
        last_event_seq = p.last_event_seq + d.wake::int,
        updated_at = CASE WHEN d.wake THEN statement_timestamp() ELSE p.updated_at END
    FROM decided d
    WHERE p.id = d.id
    RETURNING p.id, p.tenant_id, p.queue, p.last_event_seq, d.wake
),
woke AS (SELECT * FROM r WHERE wake),
t AS (UPDATE runs_tenant SET queued = queued + 1 FROM woke WHERE runs_tenant.id = woke.tenant_id),
{events}
SELECT queue FROM woke
""",
    events=event_ctes(
        "woke",
        type="'run.queued'",
        actor_type="'system'",
        actor_id="''",
        payload="jsonb_build_object('from', {waiting}, 'to', {queued}, 'reason', 'children', 'child', %(child)s::text)",
    ),
)


def child_finished(*, child_id: UUID, parent_id: UUID, succeeded: bool) -> str | None:
    """Tell a parent that its child reached a terminal state; call it in the child's transaction.

    Locks the parent's row first. Returns the parent's queue when this woke
    it (the caller wakes that queue's workers after the commit), else None.
    """
    lock_run(parent_id)
    with connection.cursor() as cursor:
        cursor.execute(
            _CHILD_FINISHED_SQL,
            {"child": str(child_id), "parent": parent_id, "succeeded": succeeded},
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


def wake_after_commit(queue: str | None) -> None:
    if queue:
        transaction.on_commit(lambda: notify_queues([queue]))


@dataclass(frozen=True)
class ChildState:
    run_id: UUID
    kind: str
    status: str
    result: Any
    error: str
    error_kind: str

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": str(self.run_id),
            "kind": self.kind,
            "status": self.status,
            "result": self.result,
            "error": self.error,
            "error_kind": self.error_kind,
        }


@dataclass(frozen=True)
class GatherState:
    """What ``begin_gather`` found: the children, and whether the gather is over."""

    children: list[ChildState]
    met: bool  # enough finished (or too few can still succeed)
    timed_out: bool
    until: datetime | None  # the gather's timer, if it has one
    pending: list[UUID]  # awaited children still live


_GATHER_SQL = sql("""
SELECT c.id, c.kind, c.status, c.result, c.error, c.error_kind
FROM unnest(%(children)s::uuid[]) WITH ORDINALITY AS x(id, n)
JOIN runs_run c ON c.id = x.id AND c.parent_id = %(run)s
ORDER BY x.n
""")

# The gather's timer: the one it recorded when it first waited, else now +
# timeout (NULL without a timeout); and the database's now.
_TIMER_SQL = """
SELECT COALESCE(
    (SELECT (output ->> 'until')::timestamptz FROM runs_step
     WHERE run_id = %(run)s AND generation = %(generation)s AND seq = %(seq)s AND status = 'waiting'),
    statement_timestamp() + make_interval(secs => %(timeout)s)), statement_timestamp()
"""

_PARK_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, children_pending = %(pending_n)s, children_needed = %(needed)s,
        {next_seq}
    WHERE {guard}
    RETURNING id, last_event_seq, steps_done, steps_total
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                           tokens_out, cost_cents, status, executions, error, text_replaced, started_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, 'child', %(input)s::jsonb,
           jsonb_build_object('pending', %(pending)s::jsonb, 'until', %(until)s::timestamptz),
           '', 0, 0, 0, {step_waiting}, 1, '', false, statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        output = EXCLUDED.output, status = {step_waiting}
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
{events}
SELECT 1 FROM r
""",
    next_seq=next_seq(),
    guard=sql(RUN_GUARD),
    events=event_ctes(
        "r",
        type="'children.awaited'",
        actor_type="'worker'",
        actor_id="%(worker)s::text",
        payload=(
            "jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'pending', %(pending_n)s,"
            " 'needed', %(needed)s::int, 'until', %(until)s::timestamptz)"
        ),
    ),
)

_CLEAR_SQL = sql(
    "UPDATE runs_run SET children_pending = 0, children_needed = NULL WHERE {guard}",
    guard=sql(RUN_GUARD),
)


@transaction.atomic
def begin_gather(
    *,
    run_id: UUID,
    token: int,
    generation: int,
    seq: int,
    name: str,
    children: list[UUID],
    min_success: int | None,
    timeout: float | None,
    worker_id: UUID,
) -> GatherState | None:
    """Read the children under the parent's row lock; park the gather step when it must wait.

    Returns None when the lease is lost. When the gather is over (``met`` or
    ``timed_out``) nothing is written but the cleared counters: the caller
    records the step. Otherwise the step is written as ``waiting`` (its
    pending children and timer) and the caller parks the run
    (``leave_running(target="waiting", recheck=True, wake_at=until)``).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            sql("SELECT 1 FROM runs_run WHERE {guard} FOR UPDATE", guard=sql(RUN_GUARD)),
            {"run": run_id, "token": token},
        )
        if cursor.fetchone() is None:
            return None
        # A fresh snapshot, after the lock: every child that finished before
        # it is seen finished; any later one will find the step below.
        cursor.execute(_GATHER_SQL, {"children": [str(c) for c in children], "run": run_id})
        states = [
            ChildState(row[0], row[1], row[2], loads(row[3]), row[4], row[5])
            for row in cursor.fetchall()
        ]
        cursor.execute(
            _TIMER_SQL, {"run": run_id, "generation": generation, "seq": seq, "timeout": timeout}
        )
        until, now = cursor.fetchone()
        live = [c for c in states if c.status not in TERMINAL_STATUSES]
        succeeded = sum(1 for c in states if c.status == "done")
        wanted = len(states) if min_success is None else min_success
        met = not live or succeeded >= wanted or succeeded + len(live) < wanted
        timed_out = until is not None and now >= until
        gathered = GatherState(states, met, timed_out and not met, until, [c.run_id for c in live])
        if met or timed_out:
            cursor.execute(_CLEAR_SQL, {"run": run_id, "token": token})
            return gathered
        cursor.execute(
            _PARK_SQL,
            {
                "run": run_id,
                "token": token,
                "generation": generation,
                "seq": seq,
                "name": name,
                "input": dumps(
                    {
                        "children": [str(c) for c in children],
                        "min_success": min_success,
                        "timeout": timeout,
                    }
                ),
                "pending": dumps([str(c.run_id) for c in live]),
                "pending_n": len(live),
                "needed": None if min_success is None else max(min_success - succeeded, 0),
                "until": until,
                "worker": worker_id,
            },
        )
        if cursor.fetchone() is None:
            return None
    return gathered


_LIVE_CHILDREN_SQL = sql(
    "SELECT id FROM runs_run WHERE parent_id = %(run)s AND status IN {live} ORDER BY id"
)


def live_children(run_id: UUID) -> list[UUID]:
    """A run's children that have not finished (on the partial index of live children)."""
    with connection.cursor() as cursor:
        cursor.execute(_LIVE_CHILDREN_SQL, {"run": run_id})
        return [row[0] for row in cursor.fetchall()]


_ORPHANS_SQL = sql("""
SELECT c.id FROM runs_run c JOIN runs_run p ON p.id = c.parent_id
WHERE c.parent_id IS NOT NULL AND c.status IN {live} AND p.status IN ({failed}, {cancelled})
  AND c.cancel_requested_at IS NULL
LIMIT %(batch)s
""")


def orphaned_children(*, batch: int) -> list[UUID]:
    """Live children whose parent failed or was cancelled: left behind when a cascade was cut short."""
    with connection.cursor() as cursor:
        cursor.execute(_ORPHANS_SQL, {"batch": batch})
        return [row[0] for row in cursor.fetchall()]
