-- The reaper's transitions (runs.engine.reaping): rescue expired leases, stop
-- runs past their deadline, expire waiting runs, keep the tenant counters
-- true. Every read is bounded, by a batch or by the tenant's own limit; the
-- rescues themselves go through the exit statement, fenced on the lease
-- token read here.

-- name: expired_leases
-- Running runs whose lease has expired (on the partial index of running
-- runs): the run's own (set by its claim and its checkpoints) and its
-- worker's (renewed by the heartbeat) have both passed.
SELECT r.id AS run_id, r.lease_token AS token, r.queue, r.parent_id, r.thread_id FROM runs_run r
WHERE r.status = {running} AND r.locked_until < statement_timestamp()
  AND NOT EXISTS (SELECT 1 FROM runs_worker w
                  WHERE w.id = r.locked_by AND w.lease_until >= statement_timestamp())
ORDER BY r.locked_until LIMIT %(limit)s

-- name: past_deadline
-- Running runs (alive or not) whose running time is past their deadline.
SELECT id AS run_id, lease_token AS token, queue, parent_id, thread_id FROM runs_run
WHERE status = {running}
  AND compensation <> 'running'  -- a rollback runs to its end (runs.engine.saga)
  AND running_seconds + EXTRACT(EPOCH FROM statement_timestamp() - claimed_at) > deadline_seconds
LIMIT %(limit)s

-- name: expire_waiting
-- Runs waiting on people (or paused) past expires_at fail as expired, in
-- one statement per batch with their Events; they hold no slot to give back.
-- A run someone else has locked is skipped (left to the next pass): never
-- waiting on a row, the batch needs no id order to be deadlock-free.
WITH r AS (
    UPDATE runs_run SET status = {failed}, error_kind = 'expired',
        error = 'nobody acted on this run before it expired (expires_at)',
        finished_at = statement_timestamp(), updated_at = statement_timestamp(),
        last_event_seq = runs_run.last_event_seq + 1
    WHERE id IN (
        SELECT id FROM runs_run
        WHERE status IN {parked} AND expires_at < statement_timestamp()
          -- Child runs and turns one at a time (expire_waiting), each with its parent's
          -- wake-up or its thread's next turn.
          AND (CASE WHEN %(only)s::uuid IS NULL THEN parent_id IS NULL AND thread_id IS NULL
                    ELSE id = %(only)s::uuid END)
        LIMIT %(batch)s FOR NO KEY UPDATE SKIP LOCKED
    )
    AND status IN {parked} AND expires_at < statement_timestamp()
    RETURNING id, last_event_seq, queue, kind
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'run.failed' AS type, 'system' AS actor_type,
           'reaper' AS actor_id, jsonb_build_object('reason', 'expired', 'error_kind', 'expired') AS payload
    FROM r
),
{outbox_and_webhooks}
SELECT queue, kind FROM r

-- name: expire_unstarted
-- Queued runs that never started and are past their time to live (start_by,
-- from expires_in on submit) fail as expired, a batch per statement with
-- their Events and webhooks; the claim already leaves them alone. A run
-- another transaction holds is skipped (left to the next pass). Their
-- tenants' rows are locked in id order, as every statement writing several
-- tenants locks them, and their queued counters go down in the next
-- statement of the transaction (count_and_notify; claim.sql says why apart).
WITH r AS (
    UPDATE runs_run SET status = {failed}, error_kind = 'expired',
        error = 'the run did not start before its time to live ran out (expires_in)',
        finished_at = statement_timestamp(), updated_at = statement_timestamp(),
        last_event_seq = runs_run.last_event_seq + 1
    WHERE id IN (
        SELECT id FROM runs_run
        WHERE status = {queued} AND start_by < statement_timestamp() AND started_at IS NULL
        ORDER BY start_by
        LIMIT %(batch)s FOR NO KEY UPDATE SKIP LOCKED
    )
    AND status = {queued} AND start_by < statement_timestamp() AND started_at IS NULL
    RETURNING id, tenant_id, last_event_seq, queue, kind
),
per_tenant AS (SELECT tenant_id, count(*) AS n FROM r GROUP BY tenant_id),
locked_tenants AS (
    SELECT t.id FROM runs_tenant t WHERE t.id IN (SELECT tenant_id FROM per_tenant)
    ORDER BY t.id FOR NO KEY UPDATE
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'run.failed' AS type, 'system' AS actor_type,
           'reaper' AS actor_id, jsonb_build_object('from', {queued}, 'reason', 'expired', 'error_kind', 'expired') AS payload
    FROM r
),
{outbox_and_webhooks}
SELECT tenant_id, queue, kind FROM r WHERE (SELECT count(*) FROM locked_tenants) >= 0

-- name: expired_children
-- Child runs and turns past expires_at, each expired alone with its
-- parent's wake-up or its thread's next turn.
SELECT id, parent_id, thread_id FROM runs_run
WHERE status IN {parked} AND expires_at < statement_timestamp()
  AND (parent_id IS NOT NULL OR thread_id IS NOT NULL)
LIMIT %(batch)s

-- name: running_suspects
-- Tenants whose running counter disagrees with their running runs: the
-- running runs are few (the partial index on running runs), so this read is
-- bounded by what runs, never by what is queued.
WITH c AS (SELECT tenant_id, count(*) AS n FROM runs_run WHERE status = {running} GROUP BY tenant_id)
SELECT t.id FROM runs_tenant t LEFT JOIN c ON c.tenant_id = t.id
WHERE t.running <> COALESCE(c.n, 0)

-- name: all_tenants
SELECT id FROM runs_tenant ORDER BY id

-- name: lock_tenant
-- The row lock waits for claims and exits in flight to commit (both write
-- the tenant row in the statement that changes the run); the counts after
-- it, in a new snapshot, then see them all.
SELECT id FROM runs_tenant WHERE id = %(tenant)s FOR UPDATE

-- name: fix_tenant
-- The running counter is set to the count of running runs, and the time of
-- that count is kept: slots workers give back later count only for runs
-- that left running after it (runs.engine.claim), since the count already
-- left out those that had left before. clock_timestamp(), evaluated after
-- the statement took its snapshot, so that no run counted as gone left
-- after it. The queued counter is approximate (backpressure only): counted
-- up to the tenant's max_queued + 1 on the claim index, never past it.
UPDATE runs_tenant t SET running = c.running,
    running_reconciled_at = CASE WHEN t.running <> c.running THEN clock_timestamp() ELSE t.running_reconciled_at END,
    queued = CASE WHEN %(queued)s THEN c.queued ELSE t.queued END
FROM (
    SELECT (SELECT count(*) FROM runs_run WHERE tenant_id = %(tenant)s AND status = {running}) AS running,
           (SELECT count(*) FROM (SELECT 1 FROM runs_run WHERE tenant_id = %(tenant)s AND status = {queued}
                                  LIMIT (SELECT max_queued + 1 FROM runs_tenant WHERE id = %(tenant)s)) q)
               AS queued
) c
WHERE t.id = %(tenant)s
  AND (t.running <> c.running
       OR %(queued)s AND t.queued <> c.queued AND (t.queued <= t.max_queued OR c.queued <= t.max_queued))
