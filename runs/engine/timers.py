"""Durable time (``ctx.sleep``): a sleep, a wait for a message with a timeout, and the timers' sweep.

A sleep is a ``sleep`` step written as ``waiting`` with the time it ends;
the run then goes back to ``queued`` with ``run_after`` at that time, so it
holds no worker, slot or connection meanwhile, and the claim picks it up
when it is due. Replay finds the step: past its end it is marked done, and
a run woken early (a person resumed it) sleeps the rest.

A wait with a timeout (``wait_for_message(timeout=)``, ``gather(timeout=)``)
parks the run in ``waiting`` with ``wake_at``; ``wake_due`` (the reaper, every
second) queues the runs whose timer is due, and the replayed step decides
that the time ran out.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from django.db import connection

from runs.db import notify_queues, sql
from runs.engine.steps import RUN_GUARD
from runs.events import event_ctes, next_seq

# The timer's end is the database's clock plus the seconds (or the time the
# agent named), like run_after everywhere: an app server's clock never
# decides when a run wakes.
_TIMER_STEP_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, {next_seq}
    WHERE {guard}
    RETURNING id, last_event_seq, steps_done, steps_total
),
t AS (
    SELECT COALESCE(%(until)s::timestamptz, statement_timestamp() + make_interval(secs => %(seconds)s)) AS until
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                           tokens_out, cost_cents, status, executions, error, text_replaced, started_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb,
           jsonb_build_object('until', t.until, 'since', statement_timestamp()),
           '', 0, 0, 0, {step_waiting}, 1, '', false, statement_timestamp()
    FROM r, t
    ON CONFLICT (run_id, generation, seq) DO NOTHING
    RETURNING id
),
{events}
SELECT t.until FROM r, t
""",
    guard=sql(RUN_GUARD),
    next_seq=next_seq(),
    events=event_ctes(
        "r",
        type="'step.started'",
        actor_type="'worker'",
        actor_id="%(worker)s::text",
        payload=(
            "jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'kind', %(kind)s::text,"
            " 'until', (SELECT until FROM t), 'steps_done', r.steps_done, 'steps_total', r.steps_total)"
        ),
    ),
)


def start_timer_step(
    *,
    run_id: UUID,
    token: int,
    generation: int,
    seq: int,
    name: str,
    kind: str,
    input: str,
    seconds: float | None = None,
    until: datetime | None = None,
    worker_id: UUID,
) -> datetime | None:
    """Write a ``sleep`` or ``message`` step as ``waiting`` until ``until`` (or now + ``seconds``).

    Returns the step's end on the database's clock, or None when the lease is lost.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            _TIMER_STEP_SQL,
            {
                "run": run_id,
                "token": token,
                "generation": generation,
                "seq": seq,
                "name": name,
                "kind": kind,
                "input": input,
                "seconds": seconds or 0,
                "until": until,
                "worker": worker_id,
            },
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


# Waiting runs whose timer is due go back to the queue, a batch at a time
# on the partial index of waiting timers; SKIP LOCKED leaves a run that a
# person or a child is changing to the next pass (a timer late by one pass
# is still due then), and, never waiting on a run, needs no id order there.
# The tenants' rows are locked in id order (runs.engine.steps.LOCK_IN_ORDER).
_WAKE_DUE_SQL = sql(
    """
WITH r AS (
    UPDATE runs_run SET status = {queued}, run_after = statement_timestamp(), wake_at = NULL,
        updated_at = statement_timestamp(), {next_seq}
    WHERE id IN (
        SELECT id FROM runs_run
        WHERE status = {waiting} AND wake_at IS NOT NULL AND wake_at <= statement_timestamp()
        ORDER BY wake_at LIMIT %(batch)s FOR NO KEY UPDATE SKIP LOCKED
    )
    AND status = {waiting}
    RETURNING id, tenant_id, queue, last_event_seq
),
n AS (SELECT tenant_id, count(*) AS n FROM r GROUP BY tenant_id),
tenants AS (
    SELECT runs_tenant.id FROM runs_tenant WHERE runs_tenant.id IN (SELECT tenant_id FROM n)
    ORDER BY runs_tenant.id FOR NO KEY UPDATE
),
t AS (
    UPDATE runs_tenant SET queued = queued + n.n
    FROM n JOIN tenants l ON l.id = n.tenant_id
    WHERE runs_tenant.id = l.id
),
{events}
SELECT queue, count(*) FROM r GROUP BY queue
""",
    next_seq=next_seq(),
    events=event_ctes(
        "r",
        type="'run.queued'",
        actor_type="'system'",
        actor_id="'timer'",
        payload="jsonb_build_object('from', {waiting}, 'to', {queued}, 'reason', 'timer')",
    ),
)


def wake_due(*, batch: int = 500) -> int:
    """Queue the waiting runs whose timer is due, and wake their workers; returns how many woke."""
    with connection.cursor() as cursor:
        cursor.execute(_WAKE_DUE_SQL, {"batch": batch})
        woken = dict(cursor.fetchall())
    if woken:
        notify_queues(set(woken))
    return sum(woken.values())
