-- What a running run reads back (runs.engine.steplog): its step log, for
-- replay, and its inbox.

-- name: load_step_log
-- Once per claim: the run's recorded steps in its current generation.
SELECT seq, name, status, output, idempotency_key, kind FROM runs_step
WHERE run_id = %(run)s AND generation = %(generation)s
ORDER BY seq

-- name: unconsumed_messages
-- The run's oldest messages no step consumed yet, a bounded page at a time.
-- A turn's own replies (author 'agent', runs.threads) are lines of its
-- conversation, never messages to it.
SELECT id, text, author_type, author_id, created_at FROM runs_message
WHERE run_id = %(run)s AND consumed_by_step_id IS NULL AND author_type <> 'agent'
ORDER BY id LIMIT %(limit)s
