"""The one exit from running (docs/architecture.md: the state machine).

Every path out of ``running`` (finish, fail, retry, park, graceful release,
lease rescue by the reaper, an operator's requeue) runs this statement,
which clears the lease, gives the tenant slot back, adds the running time,
writes the Event, and honours a cancel or pause request that landed
meanwhile: a run being parked is cancelled or paused instead. A retry that
would spend the last attempt fails the run.

A worker may defer giving the slot back (``give_slot=False``) to its next
claim, which gives back the slots of all the runs it finished since in one
write of each tenant row, instead of one write per exit on a row every
exit of a busy tenant would queue for. The exit's time, returned here, is
what the claim checks against the tenant's last reconciliation, so that the
reaper and the claim never both give back the same slot.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.db import transaction

from runs.db import engine_cursor, param_rows, sql, storable_text
from runs.engine.family import child_finished
from runs.engine.steps import BATCH_GUARD
from runs.events import event_ctes, next_seq
from runs.metrics import process as metrics
from runs.states import TERMINAL_STATUSES, RunOutcome, RunStatus
from runs.titles import SUMMARY_MAX, one_line

logger = logging.getLogger(__name__)


class Exited(NamedTuple):
    status: str  # the status reached
    queue: str
    at: datetime  # when (the database's clock)
    parent_id: UUID | None = None
    kind: str = ""
    woke_parent: str | None = None  # the queue of a parent this exit woke: wake its workers

    @property
    def leaves_orphans(self) -> bool:
        """It failed or was cancelled: its live children, if any, are to be cancelled (runs.control)."""
        return self.status in (RunStatus.FAILED, RunStatus.CANCELLED)


# One exit or several (of different runs): a worker commits the exits of
# its runs that end at the same time in one statement (``leave_many``). One
# row of ``p`` per exit; its columns are prefixed ``a_`` (an argument) so
# that none is mistaken for the run's column of the same name.
_EXIT_SQL = """
WITH p AS (
    SELECT run, token, target AS a_target, add_failure AS a_add_failure, delay AS a_delay, wake_at AS a_wake_at,
           result AS a_result, error AS a_error, error_kind AS a_error_kind, actor_type AS a_actor_type,
           actor_id AS a_actor_id, reason AS a_reason, wake_on_message AS a_wake_on_message,
           wake_on_children AS a_wake_on_children, compensation AS a_compensation, give_slot AS a_give_slot,
           outcome AS a_outcome, summary AS a_summary
    FROM json_to_recordset(%(rows)s::json)
        AS x(run uuid, token bigint, target text, add_failure int, delay float8, wake_at timestamptz, result text,
             error text, error_kind text, actor_type text, actor_id text, reason text, wake_on_message bool,
             wake_on_children bool, compensation text, give_slot bool, outcome text, summary text)
),
cur AS (
    SELECT runs_run.id, runs_run.tenant_id, runs_run.claimed_at, runs_run.heartbeat_at, p.*,
        CASE
            -- A rollback in progress is not stopped by a cancel: the run ends
            -- cancelled once its compensations ran (runs.engine.saga).
            WHEN p.a_target NOT IN {terminal} AND runs_run.cancel_requested_at IS NOT NULL
                 AND runs_run.compensation = 'requested'
                THEN {queued}
            WHEN p.a_target NOT IN {terminal} AND runs_run.cancel_requested_at IS NOT NULL
                 AND runs_run.compensation <> 'running'
                THEN {cancelled}
            WHEN p.a_target = {queued} AND runs_run.failures + p.a_add_failure >= runs_run.max_attempts
                THEN CASE WHEN runs_run.compensation = 'running' THEN {waiting_human} ELSE {failed} END
            WHEN p.a_target = {queued} AND runs_run.pause_requested_at IS NOT NULL
                THEN {paused}
            -- Parking to wait for a message, or for children, re-checks under
            -- the row lock: a message that arrived meanwhile, or a child that
            -- finished, is not missed (runs.engine.family).
            WHEN p.a_target = {waiting} AND p.a_wake_on_message AND EXISTS (
                SELECT 1 FROM runs_message m WHERE m.run_id = runs_run.id AND m.consumed_by_step_id IS NULL)
                THEN {queued}
            WHEN p.a_target = {waiting} AND p.a_wake_on_children AND (
                runs_run.children_pending = 0
                OR (runs_run.children_needed IS NOT NULL
                    AND (runs_run.children_needed = 0 OR runs_run.children_pending < runs_run.children_needed))
                OR (runs_run.cost_ceiling_cents IS NOT NULL
                    AND runs_run.cost_cents + runs_run.children_cost_cents > runs_run.cost_ceiling_cents))
                THEN {queued}
            ELSE p.a_target
        END AS new_status
    FROM runs_run JOIN p ON true
    WHERE {batch_guard}
      {reaper_guard}
    -- In id order (runs.engine.steps.LOCK_IN_ORDER), with the UPDATE's own lock.
    ORDER BY runs_run.id
    FOR NO KEY UPDATE OF runs_run
),
r AS (
    UPDATE runs_run SET
        status = cur.new_status,
        lease_token = NULL, locked_by = NULL, locked_until = NULL,
        running_seconds = runs_run.running_seconds + GREATEST(0, EXTRACT(EPOCH FROM
            ({running_until}) - cur.claimed_at)),
        failures = runs_run.failures + cur.a_add_failure,
        run_after = CASE WHEN cur.new_status = {queued} AND cur.a_target = {queued} AND cur.a_wake_at IS NOT NULL
                         THEN cur.a_wake_at
                         WHEN cur.new_status = {queued}
                         THEN statement_timestamp() + make_interval(secs => cur.a_delay) ELSE runs_run.run_after END,
        wake_at = CASE WHEN cur.new_status = {waiting} THEN cur.a_wake_at END,
        compensation = COALESCE(cur.a_compensation, CASE
            WHEN cur.new_status IN {terminal} AND runs_run.compensation = 'requested' THEN ''
            ELSE runs_run.compensation END),
        result = CASE WHEN cur.new_status = {done} THEN cur.a_result::jsonb ELSE runs_run.result END,
        error = COALESCE(cur.a_error, runs_run.error),
        error_kind = CASE
            WHEN cur.new_status = {failed} AND cur.a_target = {queued} THEN 'retryable'
            WHEN cur.new_status = {failed} THEN COALESCE(cur.a_error_kind, 'fatal')
            WHEN cur.new_status = {done} THEN ''
            ELSE COALESCE(cur.a_error_kind, runs_run.error_kind) END,
        expires_at = CASE WHEN cur.new_status IN {parked}
                          THEN statement_timestamp() + make_interval(secs => %(expires)s)
                          ELSE runs_run.expires_at END,
        finished_at = CASE WHEN cur.new_status IN {terminal} THEN statement_timestamp() END,
        current_step = CASE WHEN cur.new_status = {done} THEN '' ELSE runs_run.current_step END,
        -- What the agent reported (ctx.report) belongs to the execution that ends the run:
        -- written by the exit that makes it terminal, blank when that one reported nothing.
        outcome = CASE WHEN cur.new_status IN {terminal} THEN COALESCE(cur.a_outcome, '')
                       ELSE runs_run.outcome END,
        summary = CASE WHEN cur.new_status IN {terminal} THEN COALESCE(cur.a_summary, '')
                       ELSE runs_run.summary END,
        updated_at = statement_timestamp(),
        {next_seq}
    FROM cur
    WHERE runs_run.id = cur.id
    RETURNING runs_run.id, runs_run.tenant_id, runs_run.status, runs_run.last_event_seq,
              runs_run.error_kind, runs_run.queue, runs_run.steps_done, runs_run.steps_total,
              runs_run.cost_cents, runs_run.parent_id, runs_run.compensation, runs_run.outcome, runs_run.summary,
              runs_run.kind, cur.a_reason, cur.a_error, cur.a_result, cur.a_wake_at, cur.a_actor_type, cur.a_actor_id,
              cur.a_give_slot
),
-- Each tenant's row once, whatever number of its runs left: the slots given
-- back now, and the runs back in the queue. The rows locked in id order, as
-- the claim locks them: a batch of exits of several tenants and another
-- worker's claim or exits would deadlock otherwise.
n AS (
    SELECT r.tenant_id, count(*) FILTER (WHERE r.a_give_slot) AS given,
           count(*) FILTER (WHERE r.status = {queued}) AS requeued
    FROM r GROUP BY r.tenant_id
),
tenants AS (
    SELECT runs_tenant.id FROM runs_tenant JOIN n ON n.tenant_id = runs_tenant.id
    WHERE n.given > 0 OR n.requeued > 0
    ORDER BY runs_tenant.id
    FOR NO KEY UPDATE OF runs_tenant
),
t AS (
    UPDATE runs_tenant SET running = GREATEST(runs_tenant.running - n.given, 0), queued = runs_tenant.queued + n.requeued
    FROM n JOIN tenants l ON l.id = n.tenant_id
    WHERE runs_tenant.id = l.id
),
{events}
SELECT id, status, queue, statement_timestamp(), parent_id, kind FROM r
"""

_EVENTS = event_ctes(
    "r",
    type="'run.' || r.status",
    actor_type="r.a_actor_type",
    actor_id="r.a_actor_id",
    # What a stream's client and a webhook's receiver need to show the end
    # (or the wait) without asking again: the result, or the error and why.
    payload=(
        "jsonb_build_object('from', {running}, 'reason', r.a_reason,"
        " 'error_kind', NULLIF(r.error_kind, ''), 'error', left(r.a_error, 500),"
        " 'steps_done', r.steps_done, 'steps_total', r.steps_total, 'cost_cents', r.cost_cents)"
        " || CASE WHEN r.status = {done} THEN jsonb_build_object('result', r.a_result::jsonb) ELSE '{{}}' END"
        " || CASE WHEN r.a_wake_at IS NOT NULL AND r.status IN ({queued}, {waiting})"
        " THEN jsonb_build_object('wake_at', r.a_wake_at) ELSE '{{}}' END"
        " || CASE WHEN r.compensation <> '' THEN jsonb_build_object('compensation', r.compensation) ELSE '{{}}' END"
        " || CASE WHEN r.outcome <> '' THEN jsonb_build_object('outcome', r.outcome, 'summary', r.summary)"
        " ELSE '{{}}' END"
    ),
)


def _statement(*, only_if_expired: bool) -> str:
    return sql(
        _EXIT_SQL,
        reaper_guard="AND runs_run.locked_until < statement_timestamp()" if only_if_expired else "",
        # A rescued run was last alive at its last heartbeat, not now.
        running_until="cur.heartbeat_at" if only_if_expired else "statement_timestamp()",
        batch_guard=BATCH_GUARD,
        next_seq=next_seq(),
        events=_EVENTS,
    )


_STATEMENTS = {expired: _statement(only_if_expired=expired) for expired in (False, True)}


def leave_running(
    *,
    run_id: UUID,
    token: int,
    target: str,
    reason: str,
    actor_type: str = "worker",
    actor_id: str = "",
    result_json: str | None = None,
    error: str | None = None,
    error_kind: str | None = None,
    add_failure: bool = False,
    delay_seconds: float = 0.0,
    wake_at: datetime | None = None,
    only_if_expired: bool = False,
    expires_seconds: float | None = None,
    wake_on_message: bool = False,
    wake_on_children: bool = False,
    compensation: str | None = None,
    parent_id: UUID | None = None,
    give_slot: bool = True,
    outcome: str | None = None,
    summary: str | None = None,
    error_class: str | None = None,
) -> Exited | None:
    """Move a run out of ``running`` towards ``target``; see the module's docstring.

    Returns the status actually reached, the run's queue and the exit's time,
    or None when the guard did not match (the lease is not ``token``'s any
    more, or with ``only_if_expired`` the lease has not expired): then
    nothing changed. With ``give_slot=False`` the tenant slot stays counted
    until the caller gives it back with ``claim(returned=...)``.
    ``result_json`` must already be storable (``runs.db.dumps_storable``);
    ``error`` is untrusted text and is made storable here.

    ``wake_at`` is when a run going to ``queued`` (a sleep) becomes
    claimable, or the timer of a run going to ``waiting``. ``parent_id``
    (the run's parent, for a child run) puts the exit and the parent's
    wake-up in one transaction (``runs.engine.family``). ``compensation``
    sets the run's rollback state with the exit.

    ``outcome`` and ``summary`` are what the agent reported (``ctx.report``):
    stored, and told in the Event, when this exit ends the run (done,
    failed or cancelled); an exit that ends it without them clears any
    earlier report. ``summary`` is untrusted text and is made one bounded
    line here; an ``outcome`` that is not a ``RunOutcome`` raises ValueError.

    ``error_class`` names the error of a retry (``add_failure`` back to the
    queue) in the metrics (``agentruns_retries_total``); ``reason`` otherwise.
    """
    row = exit_row(
        run_id=run_id,
        token=token,
        target=target,
        reason=reason,
        actor_type=actor_type,
        actor_id=actor_id,
        result_json=result_json,
        error=error,
        error_kind=error_kind,
        add_failure=add_failure,
        delay_seconds=delay_seconds,
        wake_at=wake_at,
        wake_on_message=wake_on_message,
        wake_on_children=wake_on_children,
        compensation=compensation,
        give_slot=give_slot,
        outcome=outcome,
        summary=summary,
        error_class=error_class,
    )
    expires = settings.RUNS_EXPIRES_SECONDS if expires_seconds is None else expires_seconds
    statement = _STATEMENTS[only_if_expired]
    recheck = wake_on_message or wake_on_children
    if not recheck and parent_id is None:
        exited = _execute(statement, [row], expires=expires).get(run_id)
        _count(exited, row)
        if (
            exited is not None
            and exited.parent_id is not None
            and exited.status in TERMINAL_STATUSES
        ):
            # Not expected (a child's exit names its parent): tell the parent now, late but not lost.
            logger.warning(
                "run %s left running without naming its parent %s", run_id, exited.parent_id
            )
            with transaction.atomic():
                return exited._replace(woke_parent=_tell_parent(exited, run_id))
        return exited
    with transaction.atomic():
        if recheck:
            # The checks must see a message or a child's finish committed while
            # we waited for the row (post_message and child_finished hold it):
            # take the lock first, then decide in a statement with a fresh snapshot.
            with engine_cursor() as cursor:
                cursor.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run_id])
        exited = _execute(statement, [row], expires=expires).get(run_id)
        _count(exited, row)
        if (
            exited is not None
            and exited.parent_id is not None
            and exited.status in TERMINAL_STATUSES
        ):
            exited = exited._replace(woke_parent=_tell_parent(exited, run_id))
        return exited


def exit_row(
    *,
    run_id: UUID,
    token: int,
    target: str,
    reason: str,
    actor_type: str = "worker",
    actor_id: str = "",
    result_json: str | None = None,
    error: str | None = None,
    error_kind: str | None = None,
    add_failure: bool = False,
    delay_seconds: float = 0.0,
    wake_at: datetime | None = None,
    wake_on_message: bool = False,
    wake_on_children: bool = False,
    compensation: str | None = None,
    give_slot: bool = True,
    outcome: str | None = None,
    summary: str | None = None,
    error_class: str | None = None,
) -> dict[str, Any]:
    """One exit's arguments (those of ``leave_running``), checked and made storable, for ``leave_many``."""
    if outcome is not None and outcome not in RunOutcome.values:
        raise ValueError(f"unknown outcome {outcome!r}; use one of {RunOutcome.values}")
    return {
        "run": run_id,
        "token": token,
        "target": target,
        "add_failure": 1 if add_failure else 0,
        "delay": float(delay_seconds),
        "wake_at": wake_at,
        "result": result_json,
        "error": storable_text(error),
        "error_kind": error_kind,
        "actor_type": actor_type,
        "actor_id": actor_id,
        "reason": reason,
        "wake_on_message": wake_on_message,
        "wake_on_children": wake_on_children,
        "compensation": compensation,
        "give_slot": give_slot,
        "outcome": outcome,
        "summary": None if summary is None else one_line(summary, limit=SUMMARY_MAX),
        "error_class": error_class or reason,  # the metrics' name of a retry's error, not a column
    }


def leave_many(rows: list[dict[str, Any]]) -> list[Exited | None]:
    """Several runs leave running in one statement, each as ``leave_running`` would make it leave.

    ``rows`` are ``exit_row()``s of different runs, none of a child run and
    none parking to wait for a message or children (those take
    ``leave_running``, which re-checks under a lock or tells the parent).
    The answers are in the rows' order, None where the guard did not match.
    """
    if len({row["run"] for row in rows}) != len(rows):
        raise ValueError("leave_many takes one exit per run")
    if any(row["wake_on_message"] or row["wake_on_children"] for row in rows):
        raise ValueError("an exit that re-checks its wake-up takes leave_running")
    found = _execute(_STATEMENTS[False], rows, expires=settings.RUNS_EXPIRES_SECONDS)
    answers = [found.get(row["run"]) for row in rows]
    for row, exited in zip(rows, answers, strict=True):
        _count(exited, row)
    return answers


_ROW_PARAMS = (
    "run",
    "token",
    "target",
    "add_failure",
    "delay",
    "wake_at",
    "result",
    "error",
    "error_kind",
    "actor_type",
    "actor_id",
    "reason",
    "wake_on_message",
    "wake_on_children",
    "compensation",
    "give_slot",
    "outcome",
    "summary",
)


def _execute(statement: str, rows: list[dict[str, Any]], *, expires: float) -> dict[UUID, Exited]:
    params = {
        "rows": param_rows(rows, _ROW_PARAMS),
        "run": [row["run"] for row in rows],
        "expires": float(expires),
        "running": RunStatus.RUNNING,
    }
    with engine_cursor() as cursor:
        cursor.execute(statement, params)
        return {found[0]: Exited(*found[1:]) for found in cursor.fetchall()}


def _count(exited: Exited | None, row: dict[str, Any]) -> None:
    """The exit in this process's metrics (runs.metrics), once it is committed."""
    if exited is None:
        return
    if exited.status in TERMINAL_STATUSES:
        transaction.on_commit(
            lambda: metrics.run_finished(queue=exited.queue, kind=exited.kind, status=exited.status)
        )
    elif row["add_failure"] and exited.status == RunStatus.QUEUED:
        transaction.on_commit(
            lambda: metrics.retried(kind=exited.kind, error_class=row["error_class"])
        )


def _tell_parent(exited: Exited, run_id: UUID) -> str | None:
    return child_finished(
        child_id=run_id, parent_id=exited.parent_id, succeeded=exited.status == "done"
    )
