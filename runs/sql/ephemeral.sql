-- Ephemeral updates (runs.streams.ephemeral): pushed to a run's live
-- streams by NOTIFY, never stored, never replayed.

-- name: send_ephemeral
-- Like the Events' wake-ups, sent only while some web process watches the run.
SELECT pg_notify(%(channel)s, %(payload)s)
WHERE EXISTS (SELECT 1 FROM runs_streamwatch WHERE run_id = %(run)s)
