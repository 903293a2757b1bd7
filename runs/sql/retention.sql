-- Retention (runs.engine.retention): finished runs past their time are
-- deleted with everything they own, a batch per statement.

-- name: prune_finished
-- The cutoff is on the database's clock (an age), or a time the caller names.
WITH doomed AS (
    -- Oldest first on run_finished_idx; finished_at IS NOT NULL spelt out so the partial index applies.
    SELECT r.id FROM runs_run r
    WHERE r.finished_at IS NOT NULL
      AND r.finished_at < COALESCE(%(before)s::timestamptz, statement_timestamp() - make_interval(secs => %(age)s::float8))
      AND r.status IN {terminal}
      -- A thread's turns are kept as long as their thread: they are its conversation (runs.threads).
      AND r.thread_id IS NULL
      -- Leaves first (run_parent_idx): a parent waits until its children are gone.
      AND NOT EXISTS (SELECT 1 FROM runs_run c WHERE c.parent_id = r.id)
      -- A child goes only with a parent that is itself past retention (a live one may still read it).
      -- A scalar subquery, one primary-key lookup per child: as an EXISTS under OR, PostgreSQL may
      -- hash every finished run of the table instead.
      AND (r.parent_id IS NULL OR (
          SELECT p.status IN {terminal}
                 AND p.finished_at < COALESCE(%(before)s::timestamptz,
                                              statement_timestamp() - make_interval(secs => %(age)s::float8))
          FROM runs_run p WHERE p.id = r.parent_id))
      -- A webhook delivery still within its retry window is the delivery loop's work.
      AND NOT EXISTS (
          SELECT 1 FROM runs_webhookdelivery d
          WHERE d.run_id = r.id AND d.status IN {live_deliveries}
            AND d.created_at > statement_timestamp() - make_interval(secs => %(give_up)s::float8))
    ORDER BY r.finished_at
    LIMIT %(batch)s
    FOR UPDATE OF r SKIP LOCKED
),
-- ON DELETE SET NULL of runs_run.origin, which the database does not do. An array, so that
-- run_origin_idx is probed for these ids whatever the planner guesses of forks and of the batch.
-- The forks, which may be running, are waited for (their origin must go),
-- so they are locked in id order (runs.engine.steps.LOCK_IN_ORDER): a worker's
-- heartbeat over them would deadlock with this otherwise. The doomed runs
-- above are skipped when locked, never waited for: they need no order.
fork_rows AS (
    SELECT f.id FROM runs_run f
    WHERE f.origin_id = ANY (ARRAY(SELECT id FROM doomed)) AND f.id NOT IN (SELECT id FROM doomed)
    ORDER BY f.id
    FOR NO KEY UPDATE
),
forks AS (
    UPDATE runs_run f SET origin_id = NULL
    FROM fork_rows l
    WHERE f.id = l.id AND f.origin_id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING f.id
),
-- Every table below is read through an index that leads with run_id.
deliveries AS (DELETE FROM runs_webhookdelivery WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
attempts AS (DELETE FROM runs_stepattempt WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
messages AS (DELETE FROM runs_message WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
artifacts AS (DELETE FROM runs_artifact WHERE run_id IN (SELECT id FROM doomed) RETURNING file),
steps AS (DELETE FROM runs_step WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
events AS (DELETE FROM runs_event WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
watches AS (DELETE FROM runs_streamwatch WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
gone AS (DELETE FROM runs_run WHERE id IN (SELECT id FROM doomed) RETURNING 1)
SELECT (SELECT count(*) FROM gone) AS runs,
       (SELECT count(*) FROM steps) AS steps,
       (SELECT count(*) FROM attempts) AS attempts,
       (SELECT count(*) FROM events) AS events,
       (SELECT count(*) FROM messages) AS messages,
       (SELECT count(*) FROM artifacts) AS artifacts,
       (SELECT count(*) FROM deliveries) AS deliveries,
       (SELECT count(*) FROM watches) AS watches,
       (SELECT count(*) FROM forks) AS forks_detached,
       ARRAY(SELECT file FROM artifacts WHERE file <> '') AS files
