"""Parents and their child runs (docs/how-to/fan-out.md): gathering children, and the wake-up no child can lose.

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

The statements are in ``runs/sql/family.sql``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connection, transaction

from runs.db import dumps, loads, notify_queues
from runs.queries import one, queries, rows, single
from runs.states import TERMINAL_STATUSES


def lock_run(run_id: UUID) -> None:
    """Lock a run's row until the transaction ends (a parent's, before its child's transition decides)."""
    with connection.cursor() as cursor:
        cursor.execute(queries.lock_run, {"run": run_id})


def child_finished(*, child_id: UUID, parent_id: UUID, succeeded: bool) -> str | None:
    """Tell a parent that its child reached a terminal state; call it in the child's transaction.

    Locks the parent's row first. Returns the parent's queue when this woke
    it (the caller wakes that queue's workers after the commit), else None.
    """
    lock_run(parent_id)
    with connection.cursor() as cursor:
        cursor.execute(
            queries.child_finished,
            {"child": str(child_id), "parent": parent_id, "succeeded": succeeded},
        )
        row = one(cursor)
    return None if row is None else row["queue"]


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
        cursor.execute(queries.lock_held_run, {"run": run_id, "token": token})
        if one(cursor) is None:
            return None
        # A fresh snapshot, after the lock: every child that finished before
        # it is seen finished; any later one will find the step below.
        cursor.execute(
            queries.gather_children, {"children": [str(c) for c in children], "run": run_id}
        )
        states = [ChildState(**row | {"result": loads(row["result"])}) for row in rows(cursor)]
        cursor.execute(
            queries.gather_timer,
            {"run": run_id, "generation": generation, "seq": seq, "timeout": timeout},
        )
        timer = single(cursor)
        until, now = timer["until"], timer["now"]
        live = [c for c in states if c.status not in TERMINAL_STATUSES]
        succeeded = sum(1 for c in states if c.status == "done")
        wanted = len(states) if min_success is None else min_success
        met = not live or succeeded >= wanted or succeeded + len(live) < wanted
        timed_out = until is not None and now >= until
        gathered = GatherState(states, met, timed_out and not met, until, [c.run_id for c in live])
        if met or timed_out:
            cursor.execute(queries.clear_gather, {"run": run_id, "token": token})
            return gathered
        cursor.execute(
            queries.park_gather,
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
        if one(cursor) is None:
            return None
    return gathered


def live_children(run_id: UUID) -> list[UUID]:
    """A run's children that have not finished (on the partial index of live children)."""
    with connection.cursor() as cursor:
        cursor.execute(queries.live_children, {"run": run_id})
        return [row["id"] for row in rows(cursor)]


def orphaned_children(*, batch: int) -> list[UUID]:
    """Live children whose parent failed or was cancelled: left behind when a cascade was cut short."""
    with connection.cursor() as cursor:
        cursor.execute(queries.orphaned_children, {"batch": batch})
        return [row["id"] for row in rows(cursor)]
