-- What a running run records of its finished steps (runs.engine.steps). Every
-- statement is fenced by the run's lease (run_guard, batch_guard) and writes
-- the step, the run's progress and money, and the Event together, or nothing.

-- fragment: checkpoint_step
-- The checkpoint of one step or of many (each of another run): a worker
-- commits the checkpoints of its runs that finished a step at the same time
-- in one statement. One row of p per step: p's columns, declared here and
-- only here, are the fields of runs.engine.steps.Checkpoint
-- (runs.engine.recordset).
--
-- Every statement that writes several runs locks their rows in one order,
-- the primary key's, before it writes them: two such statements over the
-- same runs (the heartbeat, the committer's checkpoints and exits, the
-- reaper, another worker's committer) then queue one behind the other
-- instead of deadlocking. The lock is the UPDATE's own (FOR NO KEY UPDATE),
-- so the UPDATE that follows never upgrades it. The same holds of tenant
-- rows, also locked in id order.
--
-- A transaction of several such statements must lock all its runs in the
-- first: the committer's checkpoints and exits commit together, and the
-- exits' runs, locked by a second statement, would come after the
-- checkpoints' in no order. So the checkpoint locks the runs of its lock
-- parameter: its own and those of the exits that follow it
-- (checkpoint_many(lock=...)), found by primary key.
--
-- (The statement's first kilobyte, which pg_stat_activity shows, is kept
-- free of comments: these stay here, above it.)
p AS (
    SELECT * FROM json_to_recordset(%(rows)s::json)
        AS p(run uuid, token bigint, generation int, seq int, name text, kind text, input text, output text, key text,
             tokens_in bigint, tokens_out bigint, cost numeric, started_at timestamptz, text_replaced bool,
             steps_total int)
),
-- The lock order: see above.
locked AS (
    SELECT runs_run.id FROM runs_run
    WHERE runs_run.id = ANY(%(lock)s::uuid[])
    ORDER BY runs_run.id
    FOR NO KEY UPDATE
),
r AS (
    UPDATE runs_run SET
        -- A compensation undoes a step: it is not progress.
        steps_done = runs_run.steps_done + (p.kind <> 'compensation')::int,
        steps_total = COALESCE(p.steps_total, runs_run.steps_total),
        current_step = p.name,
        cost_cents = runs_run.cost_cents + p.cost,
        failures = 0,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s),
        heartbeat_at = statement_timestamp(),
        updated_at = statement_timestamp(),
        last_event_seq = runs_run.last_event_seq + 1
    FROM p JOIN locked l ON l.id = p.run
    WHERE {batch_guard} AND runs_run.id = l.id
    RETURNING runs_run.id, runs_run.tenant_id, runs_run.last_event_seq,
              runs_run.cancel_requested_at IS NOT NULL AS cancel, runs_run.pause_requested_at IS NOT NULL AS pause,
              runs_run.cost_cents + runs_run.children_cost_cents AS spent, runs_run.steps_done, runs_run.steps_total,
              p.generation, p.seq, p.name, p.kind, p.input, p.output, p.key, p.tokens_in, p.tokens_out, p.cost,
              p.started_at, p.text_replaced
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in, tokens_out,
                           cost_cents, status, executions, error, text_replaced, started_at, ended_at)
    SELECT r.id, r.generation, r.seq, r.name, r.kind, r.input::jsonb, r.output::jsonb,
           r.key, r.tokens_in, r.tokens_out, r.cost, {step_done}, 1, '', r.text_replaced,
           r.started_at, statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        output = EXCLUDED.output, status = {step_done}, error = '',
        tokens_in = runs_step.tokens_in + EXCLUDED.tokens_in,
        tokens_out = runs_step.tokens_out + EXCLUDED.tokens_out,
        cost_cents = runs_step.cost_cents + EXCLUDED.cost_cents,
        -- A write-ahead row already counted this execution when it began; a
        -- sleep, timed wait or gather that ends was one execution all along.
        executions = runs_step.executions + (runs_step.status NOT IN ({step_running}, {step_waiting}))::int,
        text_replaced = runs_step.text_replaced OR EXCLUDED.text_replaced,
        started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at
    WHERE runs_step.status <> {step_done}
    RETURNING id
)

-- fragment: steps_daily_cost
-- Adds the steps' cost to their tenants' spend of the day (UTC), one row per
-- tenant, in tenant order (the lock order: two workers' batches write the
-- same tenants' rows); a step that cost nothing writes no row.
d AS (
    INSERT INTO runs_tenantdailycost (tenant_id, day, cost_cents)
    SELECT r.tenant_id, (statement_timestamp() AT TIME ZONE 'UTC')::date, sum(r.cost)
    FROM r WHERE r.cost > 0 GROUP BY r.tenant_id ORDER BY r.tenant_id
    ON CONFLICT (tenant_id, day) DO UPDATE SET cost_cents = runs_tenantdailycost.cost_cents + EXCLUDED.cost_cents
)

-- name: checkpoint
-- Finished steps of one run or of several, none consuming messages or
-- undoing a step (those have a statement each, below): what the committer
-- batches. The answer says, for each run still held, whether a cancel or
-- pause was requested and what the run has spent.
WITH {checkpoint_step},
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.done' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', r.seq, 'name', r.name, 'kind', r.kind, 'tokens_in', r.tokens_in,
                              'tokens_out', r.tokens_out, 'cost_cents', r.cost,
                              'steps_done', r.steps_done, 'steps_total', r.steps_total) AS payload
    FROM r
),
{outbox},
{steps_daily_cost}
SELECT id, cancel, pause, spent FROM r

-- name: checkpoint_consuming_messages
-- The checkpoint of one message step. The messages it read are consumed with
-- it (ack after persist): a crash before this statement delivers them again.
WITH {checkpoint_step},
m AS (
    UPDATE runs_message SET consumed_by_step_id = s.id
    FROM s
    WHERE runs_message.run_id = (SELECT run FROM p) AND runs_message.id = ANY(%(message_ids)s::bigint[])
      AND runs_message.consumed_by_step_id IS NULL
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.done' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', r.seq, 'name', r.name, 'kind', r.kind, 'tokens_in', r.tokens_in,
                              'tokens_out', r.tokens_out, 'cost_cents', r.cost,
                              'steps_done', r.steps_done, 'steps_total', r.steps_total)
           || CASE WHEN cardinality(%(message_ids)s::bigint[]) > 0
                   THEN jsonb_build_object('messages', to_jsonb(%(message_ids)s::bigint[])) ELSE '{{}}' END
           AS payload
    FROM r
),
{outbox},
{steps_daily_cost}
SELECT id, cancel, pause, spent FROM r

-- name: checkpoint_compensation
-- The checkpoint of one compensation: it marks the step it undid
-- (runs.engine.saga) as compensated.
WITH {checkpoint_step},
undone AS (
    UPDATE runs_step SET status = {step_compensated}
    WHERE run_id = (SELECT run FROM p) AND generation = (SELECT generation FROM p)
      AND seq = %(compensates)s::int AND status = {step_done} AND EXISTS (SELECT 1 FROM s)
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.done' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', r.seq, 'name', r.name, 'kind', r.kind, 'tokens_in', r.tokens_in,
                              'tokens_out', r.tokens_out, 'cost_cents', r.cost,
                              'steps_done', r.steps_done, 'steps_total', r.steps_total) AS payload
    FROM r
),
{outbox},
{steps_daily_cost}
SELECT id, cancel, pause, spent FROM r

-- name: record_step_failure
-- A failed execution of a step: the Step row (failed, or waiting for a
-- person after an ambiguous side effect), one StepAttempt that keeps the
-- try, what it cost (on the run and the tenant's day), and its Event.
WITH r AS (
    UPDATE runs_run SET
        cost_cents = cost_cents + %(cost)s,
        current_step = %(name)s,
        updated_at = statement_timestamp(),
        last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
    RETURNING id, tenant_id, last_event_seq, attempt, cost_cents + children_cost_cents AS spent
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in, tokens_out,
                           cost_cents, status, executions, error, text_replaced, started_at, ended_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, %(kind)s, %(input)s::jsonb, NULL, %(key)s,
           %(tokens_in)s, %(tokens_out)s, %(cost)s, %(status)s, 1, %(error)s, %(text_replaced)s,
           %(started_at)s, statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        status = EXCLUDED.status, error = EXCLUDED.error,
        tokens_in = runs_step.tokens_in + EXCLUDED.tokens_in,
        tokens_out = runs_step.tokens_out + EXCLUDED.tokens_out,
        cost_cents = runs_step.cost_cents + EXCLUDED.cost_cents,
        executions = runs_step.executions + (runs_step.status <> {step_running})::int,
        text_replaced = runs_step.text_replaced OR EXCLUDED.text_replaced,
        started_at = EXCLUDED.started_at, ended_at = EXCLUDED.ended_at
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
a AS (
    INSERT INTO runs_stepattempt (step_id, run_id, attempt, error, error_kind, tokens_in, tokens_out,
                                  cost_cents, worker, started_at, ended_at)
    SELECT s.id, r.id, r.attempt, %(error)s, %(error_kind)s, %(tokens_in)s, %(tokens_out)s, %(cost)s,
           %(worker)s, %(started_at)s, statement_timestamp()
    FROM r, s
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'step.failed' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'kind', %(kind)s::text,
                              'tokens_in', %(tokens_in)s, 'tokens_out', %(tokens_out)s, 'cost_cents', %(cost)s,
                              'status', %(status)s::text, 'error_kind', %(error_kind)s::text,
                              'error', left(%(error)s, 500)) AS payload
    FROM r
),
{outbox},
-- Adds the step's cost to the tenant's spend of the day (UTC), only when
-- there is a cost: a no-op failure does not touch the row.
d AS (
    INSERT INTO runs_tenantdailycost (tenant_id, day, cost_cents)
    SELECT r.tenant_id, (statement_timestamp() AT TIME ZONE 'UTC')::date, %(cost)s
    FROM r WHERE %(cost)s > 0
    ON CONFLICT (tenant_id, day) DO UPDATE SET cost_cents = runs_tenantdailycost.cost_cents + EXCLUDED.cost_cents
)
SELECT spent FROM r
