-- The event hub of a web process (runs.streams.hub): its watches, and the
-- one read of new Events for every run it was woken for.

-- name: read_new_events
-- Each woken run's Events past the seq its slowest stream saw, a page per
-- run, all runs in one query.
SELECT w.run_id, e.seq, e.type, e.actor_type, e.actor_id, e.payload::text AS payload_json, e.created_at
FROM unnest(%(runs)s::uuid[], %(after)s::int[]) AS w(run_id, after)
CROSS JOIN LATERAL (
    SELECT seq, type, actor_type, actor_id, payload, created_at
    FROM runs_event
    WHERE run_id = w.run_id AND seq > w.after
    ORDER BY seq
    LIMIT %(page)s
) e
ORDER BY w.run_id, e.seq

-- name: watch_runs
-- A watch row makes the outbox send the run's NOTIFY (runs_streamwatch);
-- refreshed while the stream is open.
INSERT INTO runs_streamwatch (run_id, server, seen_at)
SELECT unnest(%(runs)s::uuid[]), %(server)s, statement_timestamp()
ON CONFLICT (run_id, server) DO UPDATE SET seen_at = EXCLUDED.seen_at

-- name: unwatch_runs
DELETE FROM runs_streamwatch WHERE server = %(server)s AND run_id = ANY(%(runs)s::uuid[])

-- name: sweep_watches
-- Watches of web processes that stopped refreshing them (killed, or cut off).
DELETE FROM runs_streamwatch WHERE seen_at < statement_timestamp() - make_interval(secs => %(stale)s)
