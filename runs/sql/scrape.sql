-- GET /metrics (runs.metrics.scrape): the state read from the tables at
-- scrape time, every query bounded by a partial index of live rows or a
-- small table; the run table itself is never counted.

-- name: live_runs
SELECT queue, status, count(*) AS n FROM runs_run WHERE status IN {live} GROUP BY queue, status

-- name: oldest_queued
-- The claim index holds (queue, run_after) of every queued run.
SELECT queue, EXTRACT(EPOCH FROM statement_timestamp() - min(run_after)) AS age FROM runs_run
WHERE status = {queued} AND run_after <= statement_timestamp()
GROUP BY queue

-- name: live_workers
-- Worker processes registered, not stopped, seen within a lease.
SELECT count(*) AS live, COALESCE(sum(runs_held), 0) AS held, COALESCE(sum(concurrency), 0) AS slots
FROM runs_worker
WHERE stopped_at IS NULL AND last_seen_at > statement_timestamp() - make_interval(secs => %(lease)s)

-- name: busy_tenants
SELECT slug, running, queued, max_running FROM runs_tenant WHERE running > 0 OR queued > 0

-- name: tenant_costs
SELECT t.slug, sum(c.cost_cents) AS cents,
       COALESCE(sum(c.cost_cents) FILTER (WHERE c.day = (statement_timestamp() AT TIME ZONE 'UTC')::date), 0)
           AS cents_today
FROM runs_tenantdailycost c JOIN runs_tenant t ON t.id = c.tenant_id
GROUP BY t.slug

-- name: live_deliveries_by_status
-- Counted exactly up to a bound; past it the figure says "at least this many".
SELECT status, count(*) AS n
FROM (SELECT status FROM runs_webhookdelivery WHERE status IN {live_deliveries} LIMIT %(up_to)s) d
GROUP BY status

-- name: table_estimates
-- The planner's estimate: a scrape costs the same at a million runs as at a hundred.
SELECT c.relname AS name, c.reltuples AS estimate
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = ANY(%(tables)s::text[]) AND c.relkind = 'r' AND n.nspname = current_schema()

-- name: metric_snapshots
SELECT role, samples, updated_at > statement_timestamp() - make_interval(secs => %(recent)s) AS recent
FROM runs_metricsnapshot
