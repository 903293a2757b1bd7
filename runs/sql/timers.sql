-- Durable time (runs.engine.timers): a sleep, a wait with a timeout, and the timers' sweep.

-- name: start_timer_step
-- Write a sleep or message step as waiting until its end. The end is the
-- database's clock plus the seconds (or the time the agent named), like
-- run_after everywhere: an app server's clock never decides when a run wakes.
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
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
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.started' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'kind', %(kind)s::text, 'until', t.until,
                              'steps_done', r.steps_done, 'steps_total', r.steps_total) AS payload
    FROM r, t
),
{outbox}
SELECT t.until FROM r, t

-- name: wake_due
-- Waiting runs whose timer is due go back to the queue, a batch at a time
-- on the partial index of waiting timers; SKIP LOCKED leaves a run that a
-- person or a child is changing to the next pass (a timer late by one pass
-- is still due then), and, never waiting on a run, needs no id order there.
-- The tenants' rows are locked in id order (runs.engine.steps.LOCK_IN_ORDER)
-- and their queued counters raised by count_and_notify, the next statement
-- of the transaction (claim.sql says why the lock and the write are apart).
WITH r AS (
    UPDATE runs_run SET status = {queued}, run_after = statement_timestamp(), wake_at = NULL,
        updated_at = statement_timestamp(), last_event_seq = runs_run.last_event_seq + 1
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
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'run.queued' AS type, 'system' AS actor_type,
           'timer' AS actor_id, jsonb_build_object('from', {waiting}, 'to', {queued}, 'reason', 'timer') AS payload
    FROM r
),
{outbox}
SELECT tenant_id, queue, count(*) AS woken FROM r
WHERE (SELECT count(*) FROM tenants) >= 0
GROUP BY tenant_id, queue
