-- How a process's figures reach GET /metrics (runs.metrics.publish): a
-- MetricSnapshot row of its own, rewritten every few seconds; the rows of
-- processes gone folded into the one RETIRED row.

-- name: insert_snapshot
INSERT INTO runs_metricsnapshot (process, role, host, pid, samples, updated_at)
VALUES (%(process)s, %(role)s, %(host)s, %(pid)s, %(samples)s::jsonb, statement_timestamp())

-- name: update_snapshot
-- No row: it was folded into RETIRED while its process was silent.
UPDATE runs_metricsnapshot SET samples = %(samples)s::jsonb, updated_at = statement_timestamp()
WHERE process = %(process)s

-- name: silent_snapshots
-- The rows of processes silent for silent seconds, a batch at a time;
-- SKIP LOCKED leaves a row another reaper is folding.
SELECT process, samples FROM runs_metricsnapshot
WHERE process <> %(retired)s AND updated_at < statement_timestamp() - make_interval(secs => %(silent)s)
ORDER BY process LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: insert_retired_snapshot
INSERT INTO runs_metricsnapshot (process, role, host, pid, samples, updated_at)
VALUES (%(retired)s, 'retired', '', 0, '[]'::jsonb, statement_timestamp())
ON CONFLICT (process) DO NOTHING

-- name: lock_retired_snapshot
SELECT samples FROM runs_metricsnapshot WHERE process = %(retired)s FOR UPDATE

-- name: delete_snapshots
DELETE FROM runs_metricsnapshot WHERE process = ANY(%(processes)s::uuid[])
