-- The Worker rows (runs.engine.fleet): registered at start, marked seen by
-- the heartbeat (claim.sql), stopped at exit.

-- name: register_worker
-- The worker's lease starts with it (its heartbeat renews it, claim.sql).
INSERT INTO runs_worker (id, host, pid, queues, kinds, concurrency, started_at, last_seen_at, runs_held,
                         lease_until)
VALUES (%(worker)s, %(host)s, %(pid)s, %(queues)s, %(kinds)s, %(concurrency)s,
        statement_timestamp(), statement_timestamp(), 0,
        statement_timestamp() + make_interval(secs => %(lease)s))

-- name: worker_stopped
-- Its lease ends with it: a run it could not release is the reaper's at once
-- (once the run's own locked_until has passed too).
UPDATE runs_worker SET stopped_at = statement_timestamp(), runs_held = 0, lease_until = statement_timestamp()
WHERE id = %(worker)s
