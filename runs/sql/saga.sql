-- A saga's rollback (runs.engine.saga): the recorded decision to roll back,
-- and what it left undone.

-- name: begin_rollback
-- Record the rollback's plan as a done compensation step after the run's
-- last step, and mark the run as rolling back, fenced on the lease.
WITH r AS (
    UPDATE runs_run SET compensation = 'running', error = %(error)s, error_kind = %(error_kind)s,
        current_step = %(name)s, updated_at = statement_timestamp(), last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
    RETURNING id, last_event_seq
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                           tokens_out, cost_cents, status, executions, error, text_replaced, started_at, ended_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, 'compensation', NULL, %(output)s::jsonb, '', 0, 0, 0,
           {step_done}, 1, '', false, statement_timestamp(), statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO NOTHING
    RETURNING id
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'rollback.started' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', %(seq)s, 'reason', %(reason)s::text, 'error_kind', %(error_kind)s::text,
                              'plan', %(output)s::jsonb -> 'plan', 'target', %(target)s::text) AS payload
    FROM r
),
{outbox}
SELECT r.id FROM r

-- name: not_undone
-- Which of these steps are still done: their compensation was skipped (or never ran).
SELECT seq FROM runs_step
WHERE run_id = %(run)s AND generation = %(generation)s AND seq = ANY(%(seqs)s::int[]) AND status = {step_done}
ORDER BY seq DESC
