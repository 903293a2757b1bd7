-- The one exit from running (runs.engine.exit).

-- name: leave_running
-- One exit or several (of different runs): a worker commits the exits of
-- its runs that end at the same time in one statement. One row of p per
-- exit: p's columns, declared here and only here, are the fields of
-- runs.engine.exit.Exit (runs.engine.recordset). What the exit asks for is
-- p.target; the status it reaches is decided here, under the row lock, so
-- that a cancel or pause that landed meanwhile wins.
--
-- This statement is the exit while no kind or queue has a global
-- max_running (runs.engine.limits); leave_running_limited is the exit while
-- one has, and also gives back the kinds' and queues' slots.
WITH {exit_rows},
{exit_events},
{outbox_and_webhooks}
SELECT id, status, queue, statement_timestamp() AS at, parent_id, kind, thread_id, tenant_id,
       concurrency_key FROM r

-- name: leave_running_limited
WITH {exit_rows},
-- A kind's and a queue's global max_running (runs.engine.limits): their counters
-- go down at once, and only while a limit is set (a row with max_running).
-- Locked by name after the tenants, kinds then queues, as the claim locks them.
kinds_left AS (SELECT r.kind AS name, count(*) AS n FROM r GROUP BY r.kind),
kinds_locked AS (
    SELECT k.name FROM runs_kindstate k
    WHERE k.max_running IS NOT NULL AND k.name IN (SELECT name FROM kinds_left)
      AND (SELECT count(*) FROM tenants) >= 0
    ORDER BY k.name FOR NO KEY UPDATE
),
kinds_given AS (
    UPDATE runs_kindstate k SET running = GREATEST(k.running - x.n, 0)
    FROM kinds_left x JOIN kinds_locked l ON l.name = x.name
    WHERE k.name = l.name
),
queues_left AS (SELECT r.queue AS name, count(*) AS n FROM r GROUP BY r.queue),
queues_locked AS (
    SELECT q.name FROM runs_queue q
    WHERE q.max_running IS NOT NULL AND q.name IN (SELECT name FROM queues_left)
      AND (SELECT count(*) FROM kinds_locked) >= 0
    ORDER BY q.name FOR NO KEY UPDATE
),
queues_given AS (
    UPDATE runs_queue q SET running = GREATEST(q.running - x.n, 0)
    FROM queues_left x JOIN queues_locked l ON l.name = x.name
    WHERE q.name = l.name
),
{exit_events},
{outbox_and_webhooks}
SELECT id, status, queue, statement_timestamp() AS at, parent_id, kind, thread_id, tenant_id,
       concurrency_key FROM r

-- fragment: exit_rows
-- What leave_running and leave_running_limited share: the exits, the runs'
-- rows, and their tenants' counters.
p AS (
    SELECT * FROM json_to_recordset(%(rows)s::json)
        AS p(run uuid, token bigint, target text, reason text, result text, error text, error_kind text,
             add_failure bool, delay float8, wake_at timestamptz, wake_on_message bool, wake_on_children bool,
             compensation text, outcome text, summary text, actor_type text, actor_id text, give_slot bool,
             only_if_expired bool)
),
cur AS (
    SELECT runs_run.id, runs_run.tenant_id, runs_run.claimed_at, runs_run.heartbeat_at, p.*,
        CASE
            -- A rollback in progress is not stopped by a cancel: the run ends
            -- cancelled once its compensations ran (runs.engine.saga).
            WHEN p.target NOT IN {terminal} AND runs_run.cancel_requested_at IS NOT NULL
                 AND runs_run.compensation = 'requested'
                THEN {queued}
            WHEN p.target NOT IN {terminal} AND runs_run.cancel_requested_at IS NOT NULL
                 AND runs_run.compensation <> 'running'
                THEN {cancelled}
            WHEN p.target = {queued} AND runs_run.failures + p.add_failure::int >= runs_run.max_attempts
                THEN CASE WHEN runs_run.compensation = 'running' THEN {waiting_human} ELSE {failed} END
            WHEN p.target = {queued} AND runs_run.pause_requested_at IS NOT NULL
                THEN {paused}
            -- Parking to wait for a message, or for children, re-checks under
            -- the row lock: a message that arrived meanwhile, or a child that
            -- finished, is not missed (runs.engine.family).
            WHEN p.target = {waiting} AND p.wake_on_message AND EXISTS (
                SELECT 1 FROM runs_message m WHERE m.run_id = runs_run.id AND m.consumed_by_step_id IS NULL
                  AND m.author_type <> 'agent')
                THEN {queued}
            WHEN p.target = {waiting} AND p.wake_on_children AND (
                runs_run.children_pending = 0
                OR (runs_run.children_needed IS NOT NULL
                    AND (runs_run.children_needed = 0 OR runs_run.children_pending < runs_run.children_needed))
                OR (runs_run.cost_ceiling_cents IS NOT NULL
                    AND runs_run.cost_cents + runs_run.children_cost_cents > runs_run.cost_ceiling_cents))
                THEN {queued}
            ELSE p.target
        END AS new_status
    FROM runs_run JOIN p ON true
    WHERE {batch_guard}
      -- The reaper's rescue: only while the lease it saw expire is still expired,
      -- the run's and its worker's. The worker's row is locked (shared) whatever
      -- its lease says: a heartbeat renewing it meanwhile is waited for and its
      -- lease seen, and a heartbeat after this waits for this commit, so that it
      -- finds its lease had lapsed and checks its runs (claim.sql, heartbeat).
      AND (NOT p.only_if_expired OR (runs_run.locked_until < statement_timestamp()
           AND COALESCE((SELECT w.lease_until FROM runs_worker w WHERE w.id = runs_run.locked_by FOR SHARE),
                        '-infinity') < statement_timestamp()))
    -- In id order (runs.engine.steps: the lock order), with the UPDATE's own lock.
    ORDER BY runs_run.id
    FOR NO KEY UPDATE OF runs_run
),
r AS (
    UPDATE runs_run SET
        status = cur.new_status,
        lease_token = NULL, locked_by = NULL, locked_until = NULL,
        -- A rescued run was last alive at its last heartbeat, not now.
        running_seconds = runs_run.running_seconds + GREATEST(0, EXTRACT(EPOCH FROM
            (CASE WHEN cur.only_if_expired THEN cur.heartbeat_at ELSE statement_timestamp() END) - cur.claimed_at)),
        failures = runs_run.failures + cur.add_failure::int,
        run_after = CASE WHEN cur.new_status = {queued} AND cur.target = {queued} AND cur.wake_at IS NOT NULL
                         THEN cur.wake_at
                         WHEN cur.new_status = {queued}
                         THEN statement_timestamp() + make_interval(secs => cur.delay) ELSE runs_run.run_after END,
        wake_at = CASE WHEN cur.new_status = {waiting} THEN cur.wake_at END,
        compensation = COALESCE(cur.compensation, CASE
            WHEN cur.new_status IN {terminal} AND runs_run.compensation = 'requested' THEN ''
            ELSE runs_run.compensation END),
        result = CASE WHEN cur.new_status = {done} THEN cur.result::jsonb ELSE runs_run.result END,
        -- A run that ends done carries no error (an earlier attempt's is in its Events), as no error_kind.
        error = CASE WHEN cur.new_status = {done} THEN '' ELSE COALESCE(cur.error, runs_run.error) END,
        error_kind = CASE
            WHEN cur.new_status = {failed} AND cur.target = {queued} THEN 'retryable'
            WHEN cur.new_status = {failed} THEN COALESCE(cur.error_kind, 'fatal')
            WHEN cur.new_status = {done} THEN ''
            ELSE COALESCE(cur.error_kind, runs_run.error_kind) END,
        expires_at = CASE WHEN cur.new_status IN {parked}
                          THEN statement_timestamp() + make_interval(secs => %(expires)s)
                          ELSE runs_run.expires_at END,
        finished_at = CASE WHEN cur.new_status IN {terminal} THEN statement_timestamp() END,
        current_step = CASE WHEN cur.new_status = {done} THEN '' ELSE runs_run.current_step END,
        -- What the agent reported (ctx.report) belongs to the execution that ends the run:
        -- written by the exit that makes it terminal, blank when that one reported nothing.
        outcome = CASE WHEN cur.new_status IN {terminal} THEN COALESCE(cur.outcome, '')
                       ELSE runs_run.outcome END,
        summary = CASE WHEN cur.new_status IN {terminal} THEN COALESCE(cur.summary, '')
                       ELSE runs_run.summary END,
        updated_at = statement_timestamp(),
        last_event_seq = runs_run.last_event_seq + 1
    FROM cur
    WHERE runs_run.id = cur.id
    RETURNING runs_run.id, runs_run.tenant_id, runs_run.status, runs_run.last_event_seq,
              runs_run.error_kind, runs_run.queue, runs_run.steps_done, runs_run.steps_total,
              runs_run.cost_cents, runs_run.parent_id, runs_run.compensation, runs_run.outcome, runs_run.summary,
              runs_run.kind, runs_run.thread_id, runs_run.concurrency_key, cur.reason AS a_reason, cur.error AS a_error, cur.result AS a_result,
              cur.wake_at AS a_wake_at, cur.actor_type AS a_actor_type, cur.actor_id AS a_actor_id,
              cur.give_slot AS a_give_slot
),
-- Each tenant's row once, whatever number of its runs left: the slots given
-- back now, and the runs back in the queue. The rows locked in id order, as
-- the claim locks them: a batch of exits of several tenants and another
-- worker's claim or exits would deadlock otherwise.
n AS (
    SELECT r.tenant_id, count(*) FILTER (WHERE r.a_give_slot) AS given,
           count(*) FILTER (WHERE r.status = {queued}) AS requeued
    FROM r GROUP BY r.tenant_id
),
tenants AS (
    SELECT runs_tenant.id FROM runs_tenant JOIN n ON n.tenant_id = runs_tenant.id
    WHERE n.given > 0 OR n.requeued > 0
    ORDER BY runs_tenant.id
    FOR NO KEY UPDATE OF runs_tenant
),
t AS (
    UPDATE runs_tenant SET running = GREATEST(runs_tenant.running - n.given, 0), queued = runs_tenant.queued + n.requeued
    FROM n JOIN tenants l ON l.id = n.tenant_id
    WHERE runs_tenant.id = l.id
)

-- fragment: exit_events
-- What a stream's client and a webhook's receiver need to show the end
-- (or the wait) without asking again: the result, or the error and why.
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'run.' || r.status AS type, r.a_actor_type AS actor_type,
           r.a_actor_id AS actor_id,
           jsonb_build_object('from', {running}, 'reason', r.a_reason,
                              'error_kind', NULLIF(r.error_kind, ''), 'error', left(r.a_error, 500),
                              'steps_done', r.steps_done, 'steps_total', r.steps_total, 'cost_cents', r.cost_cents)
           || CASE WHEN r.status = {done} THEN jsonb_build_object('result', r.a_result::jsonb) ELSE '{{}}' END
           || CASE WHEN r.a_wake_at IS NOT NULL AND r.status IN ({queued}, {waiting})
                   THEN jsonb_build_object('wake_at', r.a_wake_at) ELSE '{{}}' END
           || CASE WHEN r.compensation <> '' THEN jsonb_build_object('compensation', r.compensation) ELSE '{{}}' END
           || CASE WHEN r.outcome <> '' THEN jsonb_build_object('outcome', r.outcome, 'summary', r.summary)
                   ELSE '{{}}' END AS payload
    FROM r
)

-- name: lock_before_exit
-- An exit that may write counters (it gives its tenant slot back, or may put
-- its run back in the queue, or a kind's or queue's limit is in force) locks
-- every row it may write in a statement before it, in the lock order: the
-- runs by id, the tenants of those in %(counted)s by id, then the limited
-- kinds and queues by name. The exit statement then finds these rows its
-- transaction's and writes the versions it holds, waiting for nobody:
-- locked and written in one statement, a row another transaction changed in
-- between can deadlock (claim.sql says how).
WITH runs AS (
    SELECT id, tenant_id, kind, queue FROM runs_run WHERE id = ANY(%(runs)s::uuid[])
    ORDER BY id FOR NO KEY UPDATE
),
tenants AS (
    SELECT t.id FROM runs_tenant t
    WHERE (SELECT count(*) FROM runs) >= 0
      AND t.id IN (SELECT tenant_id FROM runs WHERE id = ANY(%(counted)s::uuid[]))
    ORDER BY t.id FOR NO KEY UPDATE
),
kinds AS (
    SELECT k.name FROM runs_kindstate k
    WHERE %(limited)s AND (SELECT count(*) FROM tenants) >= 0
      AND k.max_running IS NOT NULL AND k.name IN (SELECT kind FROM runs)
    ORDER BY k.name FOR NO KEY UPDATE
),
queues AS (
    SELECT q.name FROM runs_queue q
    WHERE %(limited)s AND (SELECT count(*) FROM kinds) >= 0
      AND q.max_running IS NOT NULL AND q.name IN (SELECT queue FROM runs)
    ORDER BY q.name FOR NO KEY UPDATE
)
SELECT (SELECT count(*) FROM queues) AS queues

-- name: lock_run_to_recheck
-- An exit that parks a run to wait for a message or for children re-checks
-- the wake-up, and the check must see a message or a child's finish
-- committed while we waited for the row (post_message and child_finished
-- hold it): take the lock first, then decide in the exit statement, which
-- has a fresh snapshot.
SELECT 1 FROM runs_run WHERE id = %(run)s FOR UPDATE
