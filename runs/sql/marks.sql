-- What a running run records of a step before it ends (runs.engine.marks):
-- write-ahead, step.started, a pending approval, progress. Every write is
-- fenced on the lease ({run_guard}) and writes nothing when it is lost.

-- name: begin_side_effect
-- Write-ahead for side effects: the Step row is committed as running before
-- the effect, so that a crash leaves a record that the effect may have
-- happened. Re-executing a keyed step counts one more execution. The step
-- is shown as started (step.started): one written ahead of its side effect.
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, steps_total = COALESCE(%(steps_total)s, steps_total),
        last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
    RETURNING id, last_event_seq, steps_done, steps_total
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                           tokens_out, cost_cents, status, executions, error, text_replaced, started_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb, NULL, %(key)s,
           0, 0, 0, {step_running}, 1, '', %(text_replaced)s, %(started_at)s
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        status = {step_running}, executions = runs_step.executions + 1, started_at = EXCLUDED.started_at,
        idempotency_key = EXCLUDED.idempotency_key, ended_at = NULL
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.started' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', %(seq)s::int, 'name', %(name)s::text, 'kind', %(kind)s::text,
                              'steps_done', r.steps_done, 'steps_total', r.steps_total) AS payload
    FROM r
),
{outbox}
SELECT r.id FROM r

-- name: announce_step
-- A step still running after ANNOUNCE_AFTER_SECONDS is shown as the one in
-- progress (a HOT update, and its step.started Event; a fast step gets only
-- its step.done), and the cancel and pause flags come back.
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, steps_total = COALESCE(%(steps_total)s, steps_total),
        last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
    RETURNING id, last_event_seq, steps_done, steps_total,
              cancel_requested_at IS NOT NULL AS cancel, pause_requested_at IS NOT NULL AS pause
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.started' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', %(seq)s::int, 'name', %(name)s::text, 'kind', %(kind)s::text,
                              'steps_done', r.steps_done, 'steps_total', r.steps_total) AS payload
    FROM r
),
{outbox}
SELECT cancel, pause FROM r

-- name: record_pending
-- The pending approval and its Event, once: a replay that parks again on the
-- same pending step writes neither (the step exists, so the run row is not
-- touched and no seq is taken).
WITH fresh AS (
    SELECT NOT EXISTS (SELECT 1 FROM runs_step
                       WHERE run_id = %(run)s AND generation = %(generation)s AND seq = %(seq)s) AS yes
),
r AS (
    UPDATE runs_run SET current_step = %(name)s, last_event_seq = runs_run.last_event_seq + 1
    FROM fresh
    WHERE {run_guard} AND fresh.yes
    RETURNING id, last_event_seq
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                           tokens_out, cost_cents, status, executions, error, text_replaced, started_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb, NULL, '',
           0, 0, 0, {step_waiting}, 1, '', %(text_replaced)s, %(started_at)s
    FROM r
    ON CONFLICT (run_id, generation, seq) DO NOTHING
    RETURNING id
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'approval.requested' AS type, 'worker' AS actor_type,
           '' AS actor_id,
           jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text,
                              'proposal', %(input)s::jsonb -> 'proposal') AS payload
    FROM r
),
{outbox}
SELECT s.id FROM s

-- name: still_held
-- Is the run still this worker's (running, under the lease of its claim)?
SELECT id FROM runs_run WHERE {run_guard}

-- name: record_progress
-- A progress message the agent reported, as a progress Event.
WITH r AS (
    UPDATE runs_run SET steps_total = COALESCE(%(steps_total)s, steps_total),
        last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
    RETURNING id, last_event_seq, steps_done, steps_total, current_step
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'progress' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('message', %(message)s::text, 'steps_done', r.steps_done,
                              'steps_total', r.steps_total, 'current_step', r.current_step) AS payload
    FROM r
),
{outbox}
SELECT r.id FROM r
