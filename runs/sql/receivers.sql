-- Receivers that keep not answering are paused, and resumed by an operator
-- (runs.webhooks.receivers). Every change is one guarded statement: pausing
-- only a receiver not paused, resuming only a paused one.

-- name: receiver_silent
-- One more silent attempt; the count reaching the limit pauses the receiver.
INSERT INTO runs_webhookreceiver AS h (tenant_id, receiver, silent_attempts, last_error, last_failure_at,
                                       paused_at, paused_reason, resumed_at, resumed_by)
VALUES (%(tenant)s, %(receiver)s, 1, %(error)s, statement_timestamp(),
        CASE WHEN %(limit)s = 1 THEN statement_timestamp() END, CASE WHEN %(limit)s = 1 THEN %(reason)s ELSE '' END,
        NULL, '')
ON CONFLICT (tenant_id, receiver) DO UPDATE SET
    silent_attempts = h.silent_attempts + 1,
    last_error = EXCLUDED.last_error,
    last_failure_at = EXCLUDED.last_failure_at,
    paused_at = CASE WHEN h.paused_at IS NULL AND %(limit)s > 0 AND h.silent_attempts + 1 >= %(limit)s
                     THEN statement_timestamp() ELSE h.paused_at END,
    paused_reason = CASE WHEN h.paused_at IS NULL AND %(limit)s > 0 AND h.silent_attempts + 1 >= %(limit)s
                         THEN %(reason)s ELSE h.paused_reason END
RETURNING paused_at IS NOT DISTINCT FROM statement_timestamp() AS paused

-- name: receiver_answered
-- Any answer, even an error status, starts the count again.
UPDATE runs_webhookreceiver SET silent_attempts = 0
WHERE tenant_id = %(tenant)s AND receiver = %(receiver)s AND silent_attempts > 0 AND paused_at IS NULL

-- name: resume_receivers
-- Resume the paused receivers among ids, and make their waiting deliveries due in the same statement.
WITH resumed AS (
    UPDATE runs_webhookreceiver SET paused_at = NULL, paused_reason = '', silent_attempts = 0,
                                    resumed_at = statement_timestamp(), resumed_by = %(actor)s
    WHERE id = ANY(%(ids)s::bigint[]) AND paused_at IS NOT NULL
    RETURNING tenant_id, receiver
),
due AS (
    UPDATE runs_webhookdelivery d SET next_attempt_at = LEAST(d.next_attempt_at, statement_timestamp())
    FROM resumed r
    WHERE d.status = 'pending' AND d.tenant_id = r.tenant_id AND {receiver_of_d} = r.receiver
    RETURNING d.id
)
SELECT (SELECT count(*) FROM resumed) AS resumed, (SELECT count(*) FROM due) AS due

-- name: park_deliveries
-- Park the waiting deliveries of paused receivers (of one, or all), so that
-- the claim, which reads each tenant's due deliveries oldest first, does not
-- read past a paused backlog on every poll.
UPDATE runs_webhookdelivery d SET next_attempt_at = %(parked)s::timestamptz
FROM runs_webhookreceiver h
WHERE h.paused_at IS NOT NULL AND (%(tenant)s::uuid IS NULL OR (h.tenant_id = %(tenant)s AND h.receiver = %(receiver)s))
  AND d.tenant_id = h.tenant_id AND d.status = 'pending' AND d.next_attempt_at < %(parked)s::timestamptz
  AND {receiver_of_d} = h.receiver
