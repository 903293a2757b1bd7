-- After a submit commits (runs.notify): the tenants' queued counters, raised
-- for a burst of submits at once, and the workers of their queues woken.

-- name: count_and_notify
-- One round trip in its own short transaction. The NOTIFY goes out when this
-- statement commits, after the counters are raised: a worker it wakes claims
-- against a counter that is already right, and the submit never waits for the
-- tenant row behind the claims its own NOTIFY started. The tenant rows are
-- locked in id order, as every statement writing several tenants locks them.
WITH v AS (SELECT * FROM unnest(%(tenants)s::uuid[], %(counts)s::int[]) AS v(id, n)),
locked AS (
    SELECT t.id FROM runs_tenant t WHERE t.id IN (SELECT id FROM v)
    ORDER BY t.id FOR NO KEY UPDATE
),
counted AS (
    UPDATE runs_tenant t SET queued = t.queued + v.n
    FROM v JOIN locked l ON l.id = v.id
    WHERE t.id = l.id
    RETURNING t.id
)
SELECT (SELECT count(*) FROM counted) AS counted,
       (SELECT count(pg_notify(%(channel)s, q)) FROM unnest(%(queues)s::text[]) AS q) AS woken
