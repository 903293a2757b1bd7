-- Write services of the run domain (runs.services): the submit's insert and its backpressure read.

-- name: insert_queued_run
-- The run's row and its first Event (run.queued, or run.waiting for a turn
-- held behind its thread's live turn; no webhook takes either) in
-- one statement: one round trip in autocommit, no transaction to open and
-- commit, and no savepoint inside a caller's transaction, since losing an
-- idempotency race inserts nothing instead of raising. Every concrete column
-- of Run, each parameter named after its column (tests/runs/test_queries.py holds
-- the list to the model); run_after left out (None) is its db_default, the
-- database's now, and is read back.
WITH born AS (
    INSERT INTO runs_run (
        id, tenant_id, kind, kind_version, queue, priority, input, status, attempt, failures,
        max_attempts, lease_token, locked_by, locked_until, claimed_at, heartbeat_at, run_after,
        wake_at, deadline_seconds, running_seconds, expires_at, result, error, error_kind, outcome,
        summary, title, idempotency_key, request_hash, cost_cents, cost_ceiling_cents, last_event_seq,
        current_step, steps_done, steps_total, cancel_requested_at, pause_requested_at, parent_id,
        children_pending, children_needed, children_cost_cents, origin_id, origin_step, compensation,
        generation, callback_url, trace_context, created_at, started_at, finished_at, updated_at,
        thread_id, turn, start_by, concurrency_key, schedule_id
    ) VALUES (
        %(id)s, %(tenant_id)s, %(kind)s, %(kind_version)s, %(queue)s, %(priority)s, %(input)s,
        %(status)s, %(attempt)s, %(failures)s, %(max_attempts)s, %(lease_token)s, %(locked_by)s,
        %(locked_until)s, %(claimed_at)s, %(heartbeat_at)s,
        COALESCE(%(run_after)s, statement_timestamp()), %(wake_at)s, %(deadline_seconds)s,
        %(running_seconds)s, %(expires_at)s, %(result)s, %(error)s, %(error_kind)s, %(outcome)s,
        %(summary)s, %(title)s, %(idempotency_key)s, %(request_hash)s, %(cost_cents)s,
        %(cost_ceiling_cents)s, %(last_event_seq)s, %(current_step)s, %(steps_done)s, %(steps_total)s,
        %(cancel_requested_at)s, %(pause_requested_at)s, %(parent_id)s, %(children_pending)s,
        %(children_needed)s, %(children_cost_cents)s, %(origin_id)s, %(origin_step)s, %(compensation)s,
        %(generation)s, %(callback_url)s, %(trace_context)s, %(created_at)s, %(started_at)s,
        %(finished_at)s, %(updated_at)s, %(thread_id)s, %(turn)s, %(start_by)s, %(concurrency_key)s, %(schedule_id)s
    )
    ON CONFLICT DO NOTHING
    RETURNING id, last_event_seq, run_after
),
new_events AS (
    SELECT id AS run_id, last_event_seq AS seq, %(event_type)s::text AS type, %(actor_type)s::text AS actor_type,
           %(actor_id)s::text AS actor_id, %(payload)s::jsonb AS payload
    FROM born
),
{outbox}
SELECT id, run_after FROM born

-- name: queue_room
-- Raw: on every submit, the ORM's compiling of this one lookup cost more than the insert.
SELECT queued, max_queued FROM runs_tenant WHERE id = %(tenant)s
