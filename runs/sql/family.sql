-- Parents and their child runs (runs.engine.family): gathering children, and
-- the wake-up no child can lose. Lock order is the child's row, then the
-- parent's (the module's docstring says why).

-- name: lock_run
-- A run's row locked until the transaction ends (a parent's, before its
-- child's transition decides).
SELECT id FROM runs_run WHERE id = %(run)s FOR UPDATE

-- name: child_finished
-- Tell a parent that its child reached a terminal state, in the child's
-- transaction, after lock_run of the parent (a statement with a fresh
-- snapshot): the child off the gather step's pending list, at most once;
-- the counters down; what the finished children spent added to the
-- parent's; and the parent queued when the gather's condition is met.
WITH awaited AS (
    -- This child off its parent's pending list, at most once per gather.
    UPDATE runs_step s SET output = jsonb_set(s.output, '{{pending}}', (s.output -> 'pending') - %(child)s::text)
    FROM runs_run p
    WHERE p.id = %(parent)s AND s.run_id = p.id AND s.generation = p.generation
      AND s.kind = 'child' AND s.status = {step_waiting} AND (s.output -> 'pending') ? %(child)s::text
    RETURNING s.id
),
counted AS (
    SELECT p.id,
           CASE WHEN a.hit THEN GREATEST(p.children_pending - 1, 0) ELSE p.children_pending END AS pending,
           CASE WHEN a.hit AND p.children_needed IS NOT NULL
                THEN GREATEST(p.children_needed - %(succeeded)s::int, 0) ELSE p.children_needed END AS needed,
           (SELECT COALESCE(sum(c.cost_cents + c.children_cost_cents), 0) FROM runs_run c
            WHERE c.parent_id = p.id AND c.status IN {terminal}) AS children_cost,
           a.hit
    FROM runs_run p, (SELECT EXISTS (SELECT 1 FROM awaited) AS hit) a
    WHERE p.id = %(parent)s
),
-- The wake condition of a gather, on the counters after this child: every
-- awaited child finished; or (min_success) enough succeeded, or too few are
-- left to get there; or the finished children spent the parent's budget.
decided AS (
    SELECT c.*, p.status = {waiting} AND p.children_pending > 0 AND c.hit AND (
               c.pending = 0
               OR (c.needed IS NOT NULL AND (c.needed = 0 OR c.pending < c.needed))
               OR (p.cost_ceiling_cents IS NOT NULL AND p.cost_cents + c.children_cost > p.cost_ceiling_cents)
           ) AS wake
    FROM counted c JOIN runs_run p ON p.id = c.id
),
r AS (
    UPDATE runs_run p SET
        children_pending = d.pending, children_needed = d.needed, children_cost_cents = d.children_cost,
        status = CASE WHEN d.wake THEN {queued} ELSE p.status END,
        run_after = CASE WHEN d.wake THEN statement_timestamp() ELSE p.run_after END,
        wake_at = CASE WHEN d.wake THEN NULL ELSE p.wake_at END,
        last_event_seq = p.last_event_seq + d.wake::int,
        updated_at = CASE WHEN d.wake THEN statement_timestamp() ELSE p.updated_at END
    FROM decided d
    WHERE p.id = d.id
    RETURNING p.id, p.tenant_id, p.queue, p.last_event_seq, d.wake
),
woke AS (SELECT * FROM r WHERE wake),
t AS (UPDATE runs_tenant SET queued = queued + 1 FROM woke WHERE runs_tenant.id = woke.tenant_id),
new_events AS (
    SELECT woke.id AS run_id, woke.last_event_seq AS seq, 'run.queued' AS type, 'system' AS actor_type,
           '' AS actor_id,
           jsonb_build_object('from', {waiting}, 'to', {queued}, 'reason', 'children',
                              'child', %(child)s::text) AS payload
    FROM woke
),
{outbox}
SELECT queue FROM woke

-- name: lock_held_run
-- The gathering run's row, locked while it is still this worker's.
SELECT id FROM runs_run WHERE {run_guard} FOR UPDATE

-- name: gather_children
-- The gathered children, in the order they were given, that are this run's own.
SELECT c.id AS run_id, c.kind, c.status, c.result, c.error, c.error_kind
FROM unnest(%(children)s::uuid[]) WITH ORDINALITY AS x(id, n)
JOIN runs_run c ON c.id = x.id AND c.parent_id = %(run)s
ORDER BY x.n

-- name: gather_timer
-- The gather's timer: the one it recorded when it first waited, else now +
-- timeout (NULL without a timeout); and the database's now.
SELECT COALESCE(
           (SELECT (output ->> 'until')::timestamptz FROM runs_step
            WHERE run_id = %(run)s AND generation = %(generation)s AND seq = %(seq)s AND status = {step_waiting}),
           statement_timestamp() + make_interval(secs => %(timeout)s)) AS until,
       statement_timestamp() AS now

-- name: park_gather
-- The gather step written as waiting, with the children still pending and
-- its timer, and the counters on the run (the run's exit re-checks them
-- under the same lock: leave_running(recheck=True)).
WITH r AS (
    UPDATE runs_run SET current_step = %(name)s, children_pending = %(pending_n)s, children_needed = %(needed)s,
        last_event_seq = runs_run.last_event_seq + 1
    WHERE {run_guard}
    RETURNING id, last_event_seq, steps_done, steps_total
),
s AS (
    INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,
                           tokens_out, cost_cents, status, executions, error, text_replaced, started_at)
    SELECT r.id, %(generation)s, %(seq)s, %(name)s, 'child', %(input)s::jsonb,
           jsonb_build_object('pending', %(pending)s::jsonb, 'until', %(until)s::timestamptz),
           '', 0, 0, 0, {step_waiting}, 1, '', false, statement_timestamp()
    FROM r
    ON CONFLICT (run_id, generation, seq) DO UPDATE SET
        output = EXCLUDED.output, status = {step_waiting}
    WHERE runs_step.status <> {step_done}
    RETURNING id
),
new_events AS (
    SELECT r.id AS run_id, r.last_event_seq AS seq, 'children.awaited' AS type, 'worker' AS actor_type,
           %(worker)s::text AS actor_id,
           jsonb_build_object('seq', %(seq)s, 'name', %(name)s::text, 'pending', %(pending_n)s,
                              'needed', %(needed)s::int, 'until', %(until)s::timestamptz) AS payload
    FROM r
),
{outbox}
SELECT r.id FROM r

-- name: clear_gather
-- The gather is over (met or timed out): its counters cleared, the caller records the step.
UPDATE runs_run SET children_pending = 0, children_needed = NULL WHERE {run_guard}

-- name: live_children
-- A run's children that have not finished (on the partial index of live children).
SELECT id FROM runs_run WHERE parent_id = %(run)s AND status IN {live} ORDER BY id

-- name: orphaned_children
-- Live children whose parent failed or was cancelled: left behind when a cascade was cut short.
SELECT c.id FROM runs_run c JOIN runs_run p ON p.id = c.parent_id
WHERE c.parent_id IS NOT NULL AND c.status IN {live} AND p.status IN ({failed}, {cancelled})
  AND c.cancel_requested_at IS NULL
LIMIT %(batch)s
