-- A webhook delivery's life (runs.webhooks.deliveries): claimed under a
-- lease, attempted, recorded fenced by the attempt it claimed.

-- name: claim_deliveries
-- The tenants with live deliveries, one index probe each (PostgreSQL has no
-- skip scan of its own); then each one's oldest due deliveries, at most a
-- loop's slots of them, numbered (place). A delivery's turn is its place
-- after the tenant's sends in flight, and turns are taken in order
-- (round-robin), up to the tenant's share of the slots. So a claim costs the
-- number of busy tenants, not the length of anyone's backlog. A paused
-- receiver's deliveries are left out (runs.webhooks.receivers).
WITH RECURSIVE busy(tenant_id) AS (
    -- d.status IN {live_deliveries}: the predicate of the claim's index.
    (SELECT d.tenant_id FROM runs_webhookdelivery d WHERE d.status IN {live_deliveries} ORDER BY d.tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT d.tenant_id FROM runs_webhookdelivery d
            WHERE d.status IN {live_deliveries} AND d.tenant_id > busy.tenant_id ORDER BY d.tenant_id LIMIT 1)
    FROM busy WHERE busy.tenant_id IS NOT NULL
),
flight AS (
    SELECT * FROM unnest(%(flight_tenants)s::uuid[], %(flight_counts)s::int[]) AS f(tenant_id, sending)
),
due AS (
    SELECT oldest.id, busy.tenant_id, oldest.next_attempt_at,
           row_number() OVER (PARTITION BY busy.tenant_id ORDER BY oldest.next_attempt_at, oldest.id) AS place
    FROM busy CROSS JOIN LATERAL (
        SELECT d.id, d.next_attempt_at FROM runs_webhookdelivery d
        WHERE d.tenant_id = busy.tenant_id
          AND d.status IN {live_deliveries} AND d.next_attempt_at <= statement_timestamp()
          AND NOT EXISTS (SELECT 1 FROM runs_webhookreceiver h
                          WHERE h.tenant_id = d.tenant_id AND h.paused_at IS NOT NULL AND h.receiver = {receiver_of_d})
        ORDER BY d.next_attempt_at
        LIMIT %(slots)s
    ) oldest
    WHERE busy.tenant_id IS NOT NULL
),
share AS (
    SELECT GREATEST(1, LEAST(%(most)s, ceil(%(slots)s::numeric / GREATEST(1, count(*)))))::int AS slots
    FROM (SELECT tenant_id FROM due UNION SELECT tenant_id FROM flight) active
),
picked AS (
    SELECT due.id FROM due LEFT JOIN flight USING (tenant_id) CROSS JOIN share
    WHERE due.place + COALESCE(flight.sending, 0) <= share.slots
    ORDER BY due.place + COALESCE(flight.sending, 0), due.next_attempt_at
    LIMIT %(batch)s
),
locked AS (
    SELECT d.id FROM runs_webhookdelivery d
    WHERE d.id IN (SELECT id FROM picked)
      AND d.status IN {live_deliveries} AND d.next_attempt_at <= statement_timestamp()
    FOR UPDATE OF d SKIP LOCKED
),
claimed AS (
    UPDATE runs_webhookdelivery d SET
        status = 'sending', attempts = d.attempts + 1, last_attempt_at = statement_timestamp(),
        next_attempt_at = statement_timestamp() + make_interval(secs => %(lease)s)
    FROM locked WHERE d.id = locked.id
    RETURNING d.id, d.attempts, d.url, d.webhook_id, d.event_type, d.event_id, d.run_id, d.tenant_id,
              {receiver_of_d} AS receiver
)
SELECT c.id, c.attempts AS attempt, c.url, c.webhook_id, c.event_type, c.tenant_id, c.run_id,
       e.seq, e.created_at AS at, e.actor_type, e.actor_id, e.payload::text AS payload,
       r.kind, r.queue, t.slug, t.webhook_secret AS secret,
       CASE WHEN t.webhook_secret_previous <> '' AND t.webhook_secret_previous_until > statement_timestamp()
            THEN t.webhook_secret_previous END AS previous_secret,
       c.receiver
FROM claimed c
JOIN runs_event e ON e.id = c.event_id
JOIN runs_run r ON r.id = c.run_id
JOIN runs_tenant t ON t.id = c.tenant_id
ORDER BY c.id

-- name: record_delivery
-- An attempt's outcome, fenced by the attempt it claimed: a loop that
-- outlived its lease records nothing. A failure is retried after the gap,
-- and given up (dead) once the delivery is give_up old; a permanent one
-- (a refused address, 410 Gone) is dead at once.
UPDATE runs_webhookdelivery SET
    status = CASE
        WHEN %(delivered)s THEN 'delivered'
        WHEN %(permanent)s OR statement_timestamp() >= created_at + make_interval(secs => %(give_up)s) THEN 'dead'
        ELSE 'pending' END,
    next_attempt_at = LEAST(statement_timestamp() + make_interval(secs => %(gap)s),
                            created_at + make_interval(secs => %(give_up)s)),
    delivered_at = CASE WHEN %(delivered)s THEN statement_timestamp() END,
    response_code = %(code)s,
    response_body = %(body)s,
    last_error = %(error)s,
    failure = %(failure)s
WHERE id = %(id)s AND status = 'sending' AND attempts = %(attempt)s
RETURNING status, tenant_id
