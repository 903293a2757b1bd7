-- After a submit commits (runs.notify): the tenants' queued counters, raised
-- for a burst of submits at once, and the workers of their queues woken.

-- name: lock_tenants
-- Several tenants' rows, locked in id order in a statement of their own, so
-- that the next statement of the transaction writes the versions this
-- transaction holds (claim.sql says why the lock and the write are apart).
SELECT id FROM runs_tenant WHERE id = ANY(%(tenants)s::uuid[]) ORDER BY id FOR NO KEY UPDATE

-- name: count_and_notify
-- One round trip in its own short transaction. The NOTIFY goes out when this
-- statement commits, after the counters are raised: a worker it wakes claims
-- against a counter that is already right, and the submit never waits for the
-- tenant row behind the claims its own NOTIFY started. One tenant's row is
-- written by this UPDATE alone; several are locked first, in id order, by
-- lock_tenants in the same transaction. A negative count (runs that left the
-- queue without a claim) never takes a counter below 0.
WITH v AS (SELECT * FROM unnest(%(tenants)s::uuid[], %(counts)s::int[]) AS v(id, n)),
counted AS (
    UPDATE runs_tenant t
    SET queued = CASE WHEN v.n < 0 THEN GREATEST(t.queued + v.n, 0) ELSE t.queued + v.n END
    FROM v WHERE t.id = v.id
    RETURNING t.id
)
SELECT (SELECT count(*) FROM counted) AS counted,
       (SELECT count(pg_notify(%(channel)s, q)) FROM unnest(%(queues)s::text[]) AS q) AS woken
