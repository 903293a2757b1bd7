"""The outbox: the one writer of Events.

Every transition of a run and every finished step appends one Event in the
same statement, or the same transaction, as the change it reports. Its
``seq`` is the run's ``last_event_seq``, raised by the same UPDATE that makes
the change, so readers page a run's events by ``(run, seq)`` with no gap
and no duplicate.

Two doors, one writer:

- an engine statement (``runs/sql/*.sql``) ends its ``WITH`` with a CTE
  ``new_events``, one row per Event, and then the fragment ``{outbox}``, or
  ``{outbox_and_webhooks}`` when it may write a type webhooks are sent for:
  its author says which (``runs/sql/fragments.sql``, ``runs.queries``);
- ``append_event()`` is the same fragment behind a Python call, for people's
  transitions (``runs.control``) that change the run through the ORM
  (``runs/sql/events.sql``).

``event_ctes()`` and ``next_seq()`` build the same CTEs for the statements
still assembled in Python (``runs.engine.exit``, ``runs.engine.steps``),
until they too are named statements.

Its consumers are fed here, by the same statement, so that none can miss an
Event or see one that did not commit:

- live event streams (``runs.streams``): the Event's NOTIFY on
  ``EVENTS_CHANNEL`` wakes the web processes watching the run, and only
  them (``StreamWatch`` says why);
- webhooks (``runs.webhooks``): an Event of a type in
  ``WEBHOOK_EVENT_TYPES`` writes one ``WebhookDelivery`` per URL that wants
  it, the run's ``callback_url`` and its tenant's enabled endpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection

from runs.db import EVENTS_CHANNEL, dumps, sql
from runs.queries import one, queries
from runs.states import WEBHOOK_EVENT_TYPES

# The SET clause that gives a transition its Event's seq.
NEXT_SEQ = "last_event_seq = {table}.last_event_seq + 1"


def next_seq(table: str = "runs_run") -> str:
    return NEXT_SEQ.format(table=table)


@dataclass(frozen=True)
class Actor:
    """Who made a change, as Events record it: a user, an API key, a worker or the system."""

    type: str  # Event.ActorType
    id: str = ""


SYSTEM = Actor(type="system")


def event_ctes(
    source: str,
    *,
    type: str,
    actor_type: str,
    actor_id: str,
    payload: str,
    where: str = "",
) -> str:
    """CTEs that append one Event per row of ``source``; put them in the statement's ``WITH``.

    ``source`` is the CTE of updated runs: it must expose ``id`` and the
    bumped ``last_event_seq``. The other arguments are SQL expressions
    (parameters, literals or columns of ``source``; status literals as
    ``{queued}``...); ``where`` filters ``source`` rows that write no Event.
    A statement whose ``type`` is a literal no webhook listens for gets no
    delivery CTE.
    """
    condition = f"WHERE {sql(where)}" if where else ""
    ctes = sql(
        """events AS (
    INSERT INTO runs_event (run_id, seq, type, actor_type, actor_id, payload, created_at)
    SELECT {source}.id, {source}.last_event_seq, {type}, {actor_type}, {actor_id}, {payload},
           statement_timestamp()
    FROM {source} {condition}
    RETURNING id, run_id, seq, type,
        -- Wake the web processes streaming this run, and only those: the
        -- NOTIFY is sent at commit. (Evaluated for every row inserted, read
        -- or not.)
        (SELECT pg_notify('{channel}', runs_event.run_id::text)
         WHERE EXISTS (SELECT 1 FROM runs_streamwatch w WHERE w.run_id = runs_event.run_id)) IS NULL AS quiet
)""",
        source=source,
        type=sql(type),
        actor_type=sql(actor_type),
        actor_id=sql(actor_id),
        payload=sql(payload),
        condition=condition,
        channel=EVENTS_CHANNEL,
    )
    literal = type.strip()
    if (
        literal.startswith("'")
        and literal.endswith("'")
        and literal.strip("'") not in WEBHOOK_EVENT_TYPES
    ):
        return ctes
    return ctes + ",\n" + _DELIVERIES_CTE


# One delivery per URL that wants the Event: the run's callback_url, and its
# tenant's enabled endpoints registered for the type. The run's columns read
# here (tenant, callback_url) never change, so the statement's snapshot of
# the row is as good as the row it is updating.
_DELIVERIES_CTE = sql(
    """deliveries AS (
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
    WHERE e.type IN ({types})
)""",
    types=", ".join(f"'{t}'" for t in WEBHOOK_EVENT_TYPES),
)


def append_event(
    *,
    run_id: UUID,
    type: str,
    actor: Actor,
    payload: dict[str, Any] | None = None,
    first: bool = False,
) -> int:
    """Append an Event to a run with its next seq; returns the seq. Call it inside the change's transaction.

    ``first`` is for the run's first Event, when the run was just inserted
    with ``last_event_seq = 1``.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            queries.append_first_event if first else queries.append_event,
            {
                "run": run_id,
                "type": type,
                "actor_type": actor.type,
                "actor_id": actor.id,
                "payload": dumps(payload or {}),
            },
        )
        row = one(cursor)
    if row is None:
        raise LookupError(f"run {run_id} does not exist")
    return row["seq"]
