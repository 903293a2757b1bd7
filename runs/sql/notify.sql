-- After a submit commits (runs.notify): the tenants' queued counters, raised
-- for a burst of submits at once.

-- name: count_queued
-- The rows locked in id order, as every statement writing several tenants locks them.
WITH v AS (SELECT * FROM unnest(%(tenants)s::uuid[], %(counts)s::int[]) AS v(id, n)),
locked AS (
    SELECT t.id FROM runs_tenant t WHERE t.id IN (SELECT id FROM v)
    ORDER BY t.id FOR NO KEY UPDATE
)
UPDATE runs_tenant t SET queued = t.queued + v.n
FROM v JOIN locked l ON l.id = v.id
WHERE t.id = l.id
