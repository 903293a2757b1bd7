-- The Worker rows (runs.engine.fleet): registered at start, marked seen by
-- the heartbeat (claim.sql), stopped at exit.

-- name: register_worker
INSERT INTO runs_worker (id, host, pid, queues, kinds, concurrency, started_at, last_seen_at, runs_held)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s, %(kinds)s, %(concurrency)s,
        statement_timestamp(), statement_timestamp(), 0)

-- name: worker_stopped
UPDATE runs_worker SET stopped_at = statement_timestamp(), runs_held = 0 WHERE id = %(worker)s
