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

from runs.db import dumps
from runs.queries import one, queries


@dataclass(frozen=True)
class Actor:
    """Who made a change, as Events record it: a user, an API key, a worker or the system."""

    type: str  # Event.ActorType
    id: str = ""


SYSTEM = Actor(type="system")


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
