-- Rate limits shared by every worker (runs.engine.ratelimits): a sliding
-- window of 60 seconds over the reservations of each limit.

-- name: rate_limit_key
-- Which of the call's keys has a limit, the first in the caller's order; read
-- without a transaction or a lock, so that a call under no limit costs this
-- one statement.
SELECT key FROM runs_ratelimit WHERE key = ANY(%(keys)s::text[])
ORDER BY array_position(%(keys)s::text[], key)
LIMIT 1

-- name: lock_rate_limit
-- The limit's row, locked until the reservation is written: two workers
-- never both see room for the same capacity.
SELECT key, requests_per_minute, tokens_per_minute, per_tenant_share, paused_until,
       statement_timestamp() AS now
FROM runs_ratelimit WHERE key = %(key)s
FOR NO KEY UPDATE

-- name: rate_window
-- What the last 60 seconds hold (ratereservation_window_idx), all tenants
-- and the caller's tenant apart. A reservation's time is when its call
-- answered (settle_rate), never before it was sent, and a call still in
-- flight counts whatever its age (until the reaper prunes it), so that a
-- call sent late after its reservation is never outside the window that
-- holds it.
SELECT count(*) AS requests, COALESCE(sum(tokens), 0) AS tokens,
       count(*) FILTER (WHERE tenant_id = %(tenant)s::uuid) AS my_requests,
       COALESCE(sum(tokens) FILTER (WHERE tenant_id = %(tenant)s::uuid), 0) AS my_tokens
FROM runs_ratereservation
WHERE limit_id = %(key)s AND (at > %(now)s::timestamptz - interval '60 seconds' OR NOT settled)

-- name: rate_window_rows
-- The same window row by row, oldest first: when will enough of it have left?
SELECT at, tokens, settled, tenant_id = %(tenant)s::uuid AS mine
FROM runs_ratereservation
WHERE limit_id = %(key)s AND (at > %(now)s::timestamptz - interval '60 seconds' OR NOT settled)
ORDER BY at, id

-- name: reserve_rate
INSERT INTO runs_ratereservation (limit_id, tenant_id, run_id, at, tokens, settled)
VALUES (%(key)s, %(tenant)s::uuid, %(run)s::uuid, %(now)s::timestamptz, %(tokens)s, false)
RETURNING id

-- name: settle_rate
-- What the call reported replaces what was reserved for it, and it counts
-- from when it answered: no earlier than it reached the provider.
UPDATE runs_ratereservation
SET tokens = %(tokens)s, settled = true, at = GREATEST(at, statement_timestamp())
WHERE id = %(id)s

-- name: pause_rate_limit
-- A provider's Retry-After: every worker's calls under the key wait until then.
UPDATE runs_ratelimit
SET paused_until = GREATEST(COALESCE(paused_until, '-infinity'),
                            statement_timestamp() + make_interval(secs => %(seconds)s))
WHERE key = %(key)s
RETURNING paused_until

-- name: prune_rate_reservations
-- Reservations older than any window: the reaper's pass.
DELETE FROM runs_ratereservation WHERE at < statement_timestamp() - interval '5 minutes'
