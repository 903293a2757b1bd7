-- Concurrency keys (runs.engine.keys): at most one active run per key of a
-- tenant; the others wait, held (status waiting, never started), in order.

-- name: lock_key
-- The key's lock, for the rest of the transaction: every decision that makes
-- a run of the key active (a submit, a release, a retry) takes it first, then
-- reads the key's runs in a new statement, whose snapshot sees every earlier
-- holder's commit. An advisory lock, so that a key needs no row of its own;
-- two keys whose hashes meet only wait for each other.
SELECT pg_advisory_xact_lock(hashtextextended(%(tenant)s::text || '/' || %(key)s, 29))

-- name: key_runs
-- The key's live runs, oldest first (run_key_live_idx); held says which wait their turn.
SELECT id, status, (status = {waiting} AND started_at IS NULL) AS held
FROM runs_run
WHERE tenant_id = %(tenant)s AND concurrency_key = %(key)s AND status NOT IN {terminal}
ORDER BY created_at, id

-- name: release_key
-- Under the key's lock: when no run of the key is active, its oldest held run
-- is queued, with its Event. Nothing when one is active, or none is held.
WITH next AS (
    SELECT h.id FROM runs_run h
    WHERE h.tenant_id = %(tenant)s AND h.concurrency_key = %(key)s
      AND h.status = {waiting} AND h.started_at IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM runs_run a
          WHERE a.tenant_id = %(tenant)s AND a.concurrency_key = %(key)s
            AND a.status NOT IN {terminal} AND NOT (a.status = {waiting} AND a.started_at IS NULL)
      )
    ORDER BY h.created_at, h.id
    LIMIT 1
    FOR NO KEY UPDATE
),
r AS (
    UPDATE runs_run SET status = {queued}, run_after = statement_timestamp(),
        updated_at = statement_timestamp(), last_event_seq = runs_run.last_event_seq + 1
    FROM next
    WHERE runs_run.id = next.id AND runs_run.status = {waiting}
    RETURNING runs_run.id, runs_run.tenant_id, runs_run.queue, runs_run.last_event_seq
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'run.queued' AS type, 'system' AS actor_type,
           'concurrency_key' AS actor_id,
           jsonb_build_object('from', {waiting}, 'to', {queued}, 'reason', 'concurrency_key') AS payload
    FROM r
),
{outbox}
SELECT id, tenant_id, queue FROM r

-- name: stuck_keys
-- Keys with a held run and no active one: a release that never happened (its
-- process died after the holder's end committed). The reaper releases them.
SELECT DISTINCT h.tenant_id, h.concurrency_key AS key
FROM runs_run h
WHERE h.concurrency_key IS NOT NULL AND h.status = {waiting} AND h.started_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM runs_run a
      WHERE a.tenant_id = h.tenant_id AND a.concurrency_key = h.concurrency_key
        AND a.status NOT IN {terminal} AND NOT (a.status = {waiting} AND a.started_at IS NULL)
  )
LIMIT %(batch)s
