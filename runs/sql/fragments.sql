-- The outbox (runs.events): the one writer of Events. A statement that
-- changes runs ends its WITH with a CTE named new_events, one row per Event
-- to write (run_id, seq, type, actor_type, actor_id, payload; seq is the
-- run's last_event_seq, raised by the statement's own UPDATE), followed by
-- one of these two fragments.

-- fragment: outbox
-- Insert the Events. Each Event's NOTIFY wakes the web processes streaming
-- its run, and only those: it is sent at commit. (Evaluated for every row
-- inserted, read or not.)
events AS (
    INSERT INTO runs_event (run_id, seq, type, actor_type, actor_id, payload, created_at)
    SELECT run_id, seq, type, actor_type, actor_id, payload, statement_timestamp()
    FROM new_events
    RETURNING id, run_id, seq, type,
        (SELECT pg_notify('{events_channel}', runs_event.run_id::text)
         WHERE EXISTS (SELECT 1 FROM runs_streamwatch w WHERE w.run_id = runs_event.run_id)) IS NULL AS quiet
)

-- fragment: outbox_and_webhooks
-- The outbox, for a statement that may write an Event webhooks are sent for
-- ({webhook_types}): one delivery per URL that wants the Event, the run's
-- callback_url and its tenant's enabled endpoints registered for the type.
-- The run's columns read here (tenant, callback_url) never change, so the
-- statement's snapshot of the row is as good as the row it is updating.
{outbox},
deliveries AS (
    INSERT INTO runs_webhookdelivery (event_id, run_id, tenant_id, endpoint_id, url, event_type, webhook_id,
                                      status, attempts, next_attempt_at, response_body, last_error, created_at)
    SELECT e.id, e.run_id, target.tenant_id, target.endpoint_id, target.url, e.type,
           'msg_' || replace(e.run_id::text, '-', '') || '_' || e.seq,
           'pending', 0, statement_timestamp(), '', '', statement_timestamp()
    FROM events e
    JOIN runs_run run ON run.id = e.run_id
    CROSS JOIN LATERAL (
        SELECT run.tenant_id, NULL::bigint AS endpoint_id, run.callback_url AS url
        WHERE run.callback_url <> ''
        UNION ALL
        SELECT ep.tenant_id, ep.id, ep.url
        FROM runs_webhookendpoint ep
        WHERE ep.tenant_id = run.tenant_id AND ep.enabled AND e.type = ANY(ep.event_types)
    ) target
    WHERE e.type IN {webhook_types}
)

-- fragment: run_guard
-- The run is still this worker's: running, with the lease token of its claim.
id = %(run)s AND status = {running} AND lease_token = %(token)s

-- fragment: live_deliveries
-- A webhook delivery still being attempted: LIVE_DELIVERY_STATUSES (runs.models).
('pending', 'sending')

-- fragment: receiver_of_d
-- The receiver of delivery d (scheme, host and port of its url): RECEIVER_SQL
-- of d.url (runs.models), which the ORM's ReceiverOf and these statements share.
lower(substring(d.url from '^[^/?#]*//[^/?#]*'))

-- fragment: batch_guard
-- run_guard of the rows of a statement's parameter table p (one step or
-- exit per row): the runs are found by primary key, always. A prepared
-- statement's generic plan cannot know how many rows the arrays hold (it
-- guesses 10) and would rather scan every running run through the partial
-- index on status, which the statistics may think holds a handful; the
-- status compared with a parameter, unlike a literal, cannot pick that index.
runs_run.id = ANY(%(run)s::uuid[]) AND runs_run.id = p.run AND runs_run.lease_token = p.token
AND runs_run.status = %(running)s::text
