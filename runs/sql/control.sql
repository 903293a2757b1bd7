-- People's transitions that copy a run's steps (runs.control.fork,
-- runs.control.retry): INSERT ... SELECT, which the ORM cannot say in one
-- statement.

-- name: copy_steps_to_fork
-- The origin's steps before N, copied as the fork's generation 1: their
-- outputs replay, their tokens and cost stay with the origin, and no
-- execution of them happened in the fork.
INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                       tokens_out, cost_cents, status, executions, error, text_replaced, started_at, ended_at)
SELECT %(fork)s, 1, seq, name, kind, input, output, idempotency_key, 0, 0, 0, {step_done}, 0, '', text_replaced,
       started_at, ended_at
FROM runs_step
WHERE run_id = %(origin)s AND generation = %(generation)s AND seq < %(from_step)s

-- name: archive_steps_from
-- A retry from step N starts generation g+1 with steps 1..N-1 of generation
-- g; steps N.. stay behind in g.
INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                       tokens_out, cost_cents, status, executions, error, text_replaced, started_at, ended_at)
SELECT run_id, %(new_generation)s, seq, name, kind, input, output, idempotency_key, 0, 0, 0, status, executions,
       error, text_replaced, started_at, ended_at
FROM runs_step
WHERE run_id = %(run)s AND generation = %(generation)s AND seq < %(from_step)s
