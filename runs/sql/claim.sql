-- queued → running (runs.engine.claim): the claim, adopting a claim whose
-- answer was lost, and the heartbeat that keeps a claim.

-- name: claim
-- Walk tenant by tenant: only tenants that are not paused and have a free
-- slot are visited, and each contributes at most its free slots, so a tenant
-- at its limit with 100,000 queued runs costs the claim nothing. Inside a
-- tenant, queue by queue, a loose index scan of run_claim_order_idx (one descent
-- per kind present) finds which kinds have queued runs; only those this
-- worker claims (registered, not paused) are read, each in index order, so
-- 100,000 queued runs of a paused or unregistered kind cost one descent too.
-- Free slots are shared between tenants by weight (fair share, at picked).
-- The tenants' rows are locked in id order (so that concurrent multi-tenant
-- claims cannot deadlock) and their counters read on their latest version
-- under READ COMMITTED: concurrent claims never overshoot max_running, and a
-- tenant without room keeps its runs queued. The counters are written by
-- claim_counts, the next statement of the claim's transaction, never here:
-- a statement that writes a row it locked in an earlier CTE updates the
-- version its snapshot saw, and when another transaction had changed the row
-- in between, PostgreSQL takes that old version's tuple lock while holding
-- the new version's row lock, the reverse of a waiter's order: a deadlock
-- between a claim and a submit's count, seen under load
-- (tests/workers/test_no_deadlocks.py). The next statement's snapshot sees
-- the version this transaction holds, and waits for nobody.
--
-- The claim also gives back the slots of runs this worker finished since its
-- last claim (leave_running(give_slot=False)): one write of a busy tenant's
-- row per claim instead of one per exit. A slot counts only if its run left
-- running after the reaper last set the counter to the truth
-- (running_reconciled_at, read under the row lock): the reaper's count
-- already left out a run that had finished before it.
--
-- This statement is the claim while no kind or queue has a global
-- max_running (runs.engine.limits); claim_limited is the claim while one has.
WITH {claim_picks},
-- The picks their tenant has room for, best first.
final AS (
    SELECT p.* FROM picked p JOIN decided d ON d.tenant_id = p.tenant_id WHERE p.rank <= d.n
),
{claim_runs}
{outbox}
{claimed_columns}
-- Every tenant of a pick or of a slot given back is locked, whatever is
-- claimed: claim_counts writes the ones it gives slots back to as well.
FROM claimed WHERE (SELECT count(*) FROM decided) >= 0

-- name: claim_limited
-- The claim (above) while a kind or a queue has a global max_running: the
-- picks are claimed as far as their kind's and queue's counters leave room
-- too, and those counters are bumped with the tenants'.
WITH {claim_picks},
-- The picks their tenant has room for, ranked per kind and per queue in the
-- claim's order, for the global limits.
allowed AS (
    SELECT p.*, row_number() OVER (PARTITION BY p.kind ORDER BY p.pos) AS kind_rank,
           row_number() OVER (PARTITION BY p.queue ORDER BY p.pos) AS queue_rank
    FROM picked p JOIN decided d ON d.tenant_id = p.tenant_id
    WHERE p.rank <= d.n
),
-- Global max_running of a kind and of a queue (runs.engine.limits): a guarded
-- counter on the kind's or queue's row, as the tenant's, written only while
-- a limit is set (by claim_counts, as the tenants'). The rows are locked by
-- name after the tenants (each CTE reads the one before it, so it is
-- evaluated after it): kinds, then queues, as the exit statement locks them.
locked_kinds AS (
    SELECT k.name, k.max_running - k.running AS room FROM runs_kindstate k
    WHERE k.max_running IS NOT NULL AND k.name IN (SELECT kind FROM allowed)
    ORDER BY k.name FOR NO KEY UPDATE
),
locked_queues AS (
    SELECT q.name, q.max_running - q.running AS room FROM runs_queue q
    WHERE q.max_running IS NOT NULL AND q.name IN (SELECT queue FROM allowed)
      AND (SELECT count(*) FROM locked_kinds) >= 0
    ORDER BY q.name FOR NO KEY UPDATE
),
final AS (
    SELECT a.* FROM allowed a
    LEFT JOIN locked_kinds k ON k.name = a.kind
    LEFT JOIN locked_queues q ON q.name = a.queue
    WHERE (k.name IS NULL OR a.kind_rank <= k.room) AND (q.name IS NULL OR a.queue_rank <= q.room)
),
{claim_runs}
{outbox}
{claimed_columns}
-- Every tenant of a pick or of a slot given back is locked, whatever is
-- claimed: claim_counts writes the ones it gives slots back to as well.
FROM claimed WHERE (SELECT count(*) FROM decided) >= 0

-- fragment: claim_picks
-- What claim and claim_limited share: the candidates, the fair share between
-- tenants, and each tenant's room under its row lock ("decided").
returns AS (
    SELECT * FROM unnest(%(ret_tenants)s::uuid[], %(ret_times)s::timestamptz[]) AS x(tenant_id, left_at)
),
returns_per_tenant AS (
    SELECT tenant_id, count(*) AS n FROM returns GROUP BY tenant_id
),
tenants AS (
    SELECT t.id, t.max_running - t.running + COALESCE(ret.n, 0) AS free,
           GREATEST(t.running - COALESCE(ret.n, 0), 0) AS running, t.weight
    FROM runs_tenant t LEFT JOIN returns_per_tenant ret ON ret.tenant_id = t.id
    WHERE NOT t.paused AND t.running - COALESCE(ret.n, 0) < t.max_running
      -- A tenant with nothing queued in these queues costs one index probe
      -- (the loose scans below cost a descent per queue and kind present).
      AND (SELECT true FROM runs_run r
           WHERE r.tenant_id = t.id AND r.status = {queued} AND r.queue = ANY(%(queues)s::text[])
           ORDER BY r.queue, r.kind LIMIT 1)
      AND (t.daily_cost_cap_cents IS NULL OR t.daily_cost_cap_cents > COALESCE(
          (SELECT c.cost_cents FROM runs_tenantdailycost c
           WHERE c.tenant_id = t.id AND c.day = (statement_timestamp() AT TIME ZONE 'UTC')::date), 0))
),
-- A paused queue or kind offers nothing, nor does one with a global
-- max_running: in claim_limited while it is at its limit (the counter is
-- checked again under its row lock there), in claim always, so that a worker
-- that has not yet seen a new limit never claims past it.
queues AS (
    SELECT name FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM runs_queue x WHERE x.name = q.name AND (x.paused
          OR x.max_running IS NOT NULL AND (NOT %(limited)s OR x.running >= x.max_running)))
),
kinds AS (
    SELECT unnest(%(kinds)s::text[]) AS name
    EXCEPT SELECT k.name FROM runs_kindstate k WHERE k.paused
           OR k.max_running IS NOT NULL AND (NOT %(limited)s OR k.running >= k.max_running)
),
candidates AS (
    -- Each tenant's best runs, ranked inside the tenant; share is the
    -- tenant's running per unit of weight once this run would be running.
    SELECT c.*, (t.running + c.rank)::float8 / t.weight AS share
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT x.*, row_number() OVER (ORDER BY x.priority, x.fresh, x.run_after, x.created_at, x.id) AS rank
        FROM queues q
        CROSS JOIN LATERAL (
            WITH RECURSIVE present(kind) AS (
                (SELECT r.kind FROM runs_run r
                 WHERE r.tenant_id = t.id AND r.status = {queued} AND r.queue = q.name
                 ORDER BY r.kind LIMIT 1)
                UNION ALL
                SELECT (SELECT r.kind FROM runs_run r
                        WHERE r.tenant_id = t.id AND r.status = {queued} AND r.queue = q.name AND r.kind > p.kind
                        ORDER BY r.kind LIMIT 1)
                FROM present p WHERE p.kind IS NOT NULL
            )
            SELECT kind FROM present WHERE kind IN (SELECT name FROM kinds)
        ) k
        CROSS JOIN LATERAL (
            SELECT r.id, r.tenant_id, r.kind, r.queue, r.priority, (r.started_at IS NULL) AS fresh,
                   r.run_after, r.created_at
            FROM runs_run r
            WHERE r.tenant_id = t.id
              AND r.status = {queued}
              AND r.queue = q.name
              AND r.kind = k.kind
              AND r.run_after <= statement_timestamp()
              -- Past its time to live (expires_in) a run that never started is
              -- the reaper's to fail expired, never a worker's to start.
              AND (r.start_by IS NULL OR r.started_at IS NOT NULL OR r.start_by > statement_timestamp())
              -- Only versions this worker's code can resume (a rolling deploy):
              -- a run recorded by a newer version waits for a worker that has it.
              AND (r.kind_version IS NULL OR (r.kind, r.kind_version) IN (
                   SELECT * FROM unnest(%(rkinds)s::text[], %(rversions)s::int[])))
            ORDER BY r.priority, (r.started_at IS NULL), r.run_after, r.created_at, r.id
            LIMIT LEAST(t.free, %(n)s)
            -- Skipping is safe here, and never waiting is why these rows need
            -- no id order: a run another transaction holds is not claimable
            -- now anyway. The UPDATE's own lock, so that a foreign-key check
            -- (a message posted to the run) neither waits nor makes it skipped.
            FOR NO KEY UPDATE SKIP LOCKED
        ) x
        -- The tenant's best runs across its queues and kinds; rows locked
        -- above but not kept here are let go when the claim commits.
        ORDER BY x.priority, x.fresh, x.run_after, x.created_at, x.id
        LIMIT LEAST(t.free, %(n)s)
    ) c
),
-- Fair share: the free slots go first to the runs that leave their tenant
-- with the fewest running per unit of weight, so a tenant with thousands
-- queued and a high max_running takes a slot only after a tenant with fewer
-- running (per weight) has taken one. Each tenant's picks are a prefix of
-- its own order (share grows with rank), so priority and age still decide
-- inside a tenant; between equal shares, priority and age decide too.
picked AS (
    -- Both ranks over the n picks only: a window over every candidate would sort them all.
    SELECT c.id, c.tenant_id, c.kind, c.queue,
           row_number() OVER (ORDER BY c.share, c.priority, c.fresh, c.run_after, c.created_at, c.id) AS pos,
           row_number() OVER (PARTITION BY c.tenant_id ORDER BY c.rank) AS rank
    FROM (SELECT * FROM candidates ORDER BY share, priority, fresh, run_after, created_at, id LIMIT %(n)s) c
),
per_tenant AS (
    SELECT tenant_id, count(*) AS n FROM picked GROUP BY tenant_id
),
changes AS (
    SELECT tenant_id FROM per_tenant UNION SELECT tenant_id FROM returns_per_tenant
),
locked_tenants AS (
    SELECT t.id, t.running, t.max_running, t.running_reconciled_at FROM runs_tenant t
    WHERE t.id IN (SELECT tenant_id FROM changes)
    ORDER BY t.id FOR NO KEY UPDATE
),
given_back AS (
    SELECT l.id AS tenant_id, count(*) AS n
    FROM locked_tenants l JOIN returns x ON x.tenant_id = l.id
    WHERE l.running_reconciled_at IS NULL OR x.left_at > l.running_reconciled_at
    GROUP BY l.id
),
-- As many of each tenant's picked runs, best first, as its latest counter
-- leaves room for: a concurrent claim or a slot that does not count makes
-- it fewer, never more than max_running.
decided AS (
    SELECT l.id AS tenant_id, COALESCE(g.n, 0) AS returned,
           GREATEST(LEAST(COALESCE(p.n, 0), l.max_running - l.running + COALESCE(g.n, 0)), 0) AS n
    FROM locked_tenants l
    LEFT JOIN per_tenant p ON p.tenant_id = l.id
    LEFT JOIN given_back g ON g.tenant_id = l.id
)

-- fragment: claim_runs
-- The claim's writes once "final" says which runs: the runs, their Events
-- (the counters are claim_counts').
claimed AS (
    UPDATE runs_run r SET
        status = {running},
        lease_token = nextval('runs_lease_token_seq'),
        locked_by = %(worker)s,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s),
        claimed_at = statement_timestamp(),
        heartbeat_at = statement_timestamp(),
        attempt = r.attempt + 1,
        kind_version = COALESCE(r.kind_version, v.version),
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        last_event_seq = r.last_event_seq + 1
    FROM final p
    JOIN unnest(%(kinds)s::text[], %(versions)s::int[]) AS v(kind, version) ON true
    -- The status as a parameter: the picked runs are found by primary key in any plan (BATCH_GUARD says why).
    WHERE r.id = p.id AND r.status = %(queued)s::text AND v.kind = r.kind
    RETURNING r.*
),
new_events AS (
    SELECT id AS run_id, last_event_seq AS seq, 'run.running' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id, jsonb_build_object('from', {queued}, 'attempt', attempt) AS payload
    FROM claimed
),

-- fragment: claimed_columns
-- A claimed run's columns: runs.engine.claim.ClaimedRun's fields.
SELECT id, tenant_id, kind, kind_version, input, lease_token, attempt, failures, max_attempts, generation,
       deadline_seconds, running_seconds, steps_done, steps_total, cost_cents, cost_ceiling_cents,
       cancel_requested_at IS NOT NULL AS cancel_requested, pause_requested_at IS NOT NULL AS pause_requested,
       queue, claimed_at, parent_id, children_cost_cents, compensation, run_after, created_at, started_at,
       priority, trace_context, thread_id

-- name: claimed_but_not_held
-- The runs this worker holds in the database but not in memory: a claim
-- whose commit succeeded but whose answer was lost. The same columns as the
-- claim's answer.
{claimed_columns}
FROM runs_run
WHERE status = {running} AND locked_by = %(worker)s AND NOT (id = ANY(%(held)s::uuid[]))

-- name: claim_counts
-- The claim's counters, in the claim's transaction right after it, on the
-- rows it locked and decided under (why apart: the claim's header): each
-- tenant's running goes up by the runs claimed and down by the slots given
-- back, its queued down by the runs claimed; while a limit is in force
-- (%(limited)s), the limited kinds' and queues' running go up too. One row
-- per claimed run in tenants, kinds and queues. queued may dip below 0 for a
-- moment: a run can be claimed before the increment of its submit (sent
-- after commit) lands; they cancel out.
WITH claimed AS (
    SELECT * FROM unnest(%(tenants)s::uuid[], %(kinds)s::text[], %(queues)s::text[]) AS c(tenant_id, kind, queue)
),
returns AS (
    SELECT * FROM unnest(%(ret_tenants)s::uuid[], %(ret_times)s::timestamptz[]) AS x(tenant_id, left_at)
),
per_tenant AS (
    SELECT tenant_id, count(*) AS n FROM claimed GROUP BY tenant_id
),
given_back AS (
    -- As the claim counted them (claim_picks): the row is this transaction's since.
    SELECT t.id AS tenant_id, count(*) AS n
    FROM runs_tenant t JOIN returns x ON x.tenant_id = t.id
    WHERE t.running_reconciled_at IS NULL OR x.left_at > t.running_reconciled_at
    GROUP BY t.id
),
tenants AS (
    UPDATE runs_tenant t SET running = GREATEST(t.running + COALESCE(p.n, 0) - COALESCE(g.n, 0), 0),
        queued = t.queued - COALESCE(p.n, 0)
    FROM per_tenant p FULL JOIN given_back g ON g.tenant_id = p.tenant_id
    WHERE t.id = COALESCE(p.tenant_id, g.tenant_id)
    RETURNING t.id
),
kinds AS (
    UPDATE runs_kindstate k SET running = k.running + f.n
    FROM (SELECT kind, count(*) AS n FROM claimed GROUP BY kind) f
    WHERE %(limited)s AND k.name = f.kind AND k.max_running IS NOT NULL
    RETURNING k.name
),
queues AS (
    UPDATE runs_queue q SET running = q.running + f.n
    FROM (SELECT queue, count(*) AS n FROM claimed GROUP BY queue) f
    WHERE %(limited)s AND q.name = f.queue AND q.max_running IS NOT NULL
    RETURNING q.name
)
SELECT (SELECT count(*) FROM tenants) AS tenants, (SELECT count(*) FROM kinds) AS kinds,
       (SELECT count(*) FROM queues) AS queues

-- name: heartbeat
-- Renew the worker's lease (its row), whatever the number of runs it holds:
-- a run is its worker's while the worker's lease lasts (the reaper's rescue
-- locks the worker's row and checks it, exit.sql), so no run row is written
-- and none left dead behind. The row is locked first, to read the lease it
-- had: if that had lapsed, the reaper may have taken runs meanwhile, and the
-- worker checks them (held_runs, a statement of its own, after this one
-- committed and after any rescue that held the row). The runs it holds that a
-- person asked to cancel or pause come back with it (on
-- run_flagged_by_worker_idx: a handful, never every run held).
WITH prev AS (
    SELECT id, lease_until FROM runs_worker WHERE id = %(worker)s FOR NO KEY UPDATE
),
renewed AS (
    UPDATE runs_worker w SET
        last_seen_at = statement_timestamp(),
        lease_until = statement_timestamp() + make_interval(secs => %(lease)s),
        runs_held = %(held)s
    FROM prev WHERE w.id = prev.id
    RETURNING prev.lease_until IS NULL OR prev.lease_until < statement_timestamp() AS lapsed
),
flagged AS (
    SELECT lease_token, cancel_requested_at IS NOT NULL AS cancel, pause_requested_at IS NOT NULL AS pause
    FROM runs_run
    WHERE locked_by = %(worker)s AND status = {running}
      AND (cancel_requested_at IS NOT NULL OR pause_requested_at IS NOT NULL)
)
SELECT renewed.lapsed, flagged.lease_token, flagged.cancel, flagged.pause
FROM renewed LEFT JOIN flagged ON true

-- name: held_runs
-- Which of the runs a worker believes it holds are still its own (after its
-- lease had lapsed), with their cancel and pause flags; a token missing from
-- the answer has lost its lease.
SELECT lease_token, cancel_requested_at IS NOT NULL AS cancel, pause_requested_at IS NOT NULL AS pause
FROM runs_run
WHERE id = ANY(%(ids)s::uuid[]) AND lease_token = ANY(%(tokens)s::bigint[]) AND status = {running}
