-- Global max_running of a kind or a queue (runs.engine.limits): set by an
-- operator, enforced by the claim (runs/sql/claim.sql), given back by the exit
-- (runs/sql/exit.sql), kept true by the reaper.

-- name: lock_limited_kinds
-- Every limited kind's row, by name (the claim's order after the tenants):
-- claims and exits of these kinds in flight commit first, and none starts
-- until this transaction ends, so the count that follows, in a new
-- statement, sees them all.
SELECT name FROM runs_kindstate WHERE max_running IS NOT NULL ORDER BY name FOR NO KEY UPDATE

-- name: fix_kind_counters
UPDATE runs_kindstate k SET running = c.n
FROM (SELECT k2.name, (SELECT count(*) FROM runs_run r WHERE r.status = {running} AND r.kind = k2.name) AS n
      FROM runs_kindstate k2 WHERE k2.max_running IS NOT NULL) c
WHERE k.name = c.name AND k.running <> c.n
RETURNING k.name

-- name: lock_limited_queues
SELECT name FROM runs_queue WHERE max_running IS NOT NULL ORDER BY name FOR NO KEY UPDATE

-- name: fix_queue_counters
UPDATE runs_queue q SET running = c.n
FROM (SELECT q2.name, (SELECT count(*) FROM runs_run r WHERE r.status = {running} AND r.queue = q2.name) AS n
      FROM runs_queue q2 WHERE q2.max_running IS NOT NULL) c
WHERE q.name = c.name AND q.running <> c.n
RETURNING q.name

-- name: count_running_of_kind
SELECT count(*) AS n FROM runs_run WHERE status = {running} AND kind = %(name)s

-- name: count_running_of_queue
SELECT count(*) AS n FROM runs_run WHERE status = {running} AND queue = %(name)s

-- name: limits_in_force
-- Whether the claim must be claim_limited (runs.engine.claim), read every few seconds.
SELECT EXISTS (SELECT 1 FROM runs_kindstate WHERE max_running IS NOT NULL)
    OR EXISTS (SELECT 1 FROM runs_queue WHERE max_running IS NOT NULL) AS in_force
