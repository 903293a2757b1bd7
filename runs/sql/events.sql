-- The outbox's door for people's transitions (runs.events.append_event):
-- changes made through the ORM append their Event here, in the change's
-- transaction. The type is a parameter, so either may write one webhooks
-- are sent for.

-- name: append_first_event
-- A run inserted with last_event_seq = 1 (a submit, a fork) gets its first
-- Event without touching the run row again.
WITH new_events AS (
    SELECT %(run)s::uuid AS run_id, 1 AS seq, %(type)s::text AS type, %(actor_type)s::text AS actor_type,
           %(actor_id)s::text AS actor_id, %(payload)s::jsonb AS payload
),
{outbox_and_webhooks}
SELECT seq FROM new_events

-- name: append_event
-- The run's next seq, taken by the UPDATE that bumps it.
WITH bumped AS (
    UPDATE runs_run SET last_event_seq = runs_run.last_event_seq + 1, updated_at = statement_timestamp()
    WHERE id = %(run)s
    RETURNING id, last_event_seq
),
new_events AS (
    SELECT id AS run_id, last_event_seq AS seq, %(type)s::text AS type, %(actor_type)s::text AS actor_type,
           %(actor_id)s::text AS actor_id, %(payload)s::jsonb AS payload
    FROM bumped
),
{outbox_and_webhooks}
SELECT seq FROM new_events
