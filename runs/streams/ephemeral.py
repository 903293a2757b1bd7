"""Ephemeral updates (``ctx.emit``): pushed to a run's live streams by NOTIFY, never stored, never replayed.

They share the streams' channel with the Events' wake-ups: a wake-up's
payload is a run id, an ephemeral update's a JSON object. Like the
wake-ups, one is sent only while some web process watches the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection

from runs.db import EVENTS_CHANNEL, dumps_storable
from runs.queries import queries

# NOTIFY payloads stop at 8000 bytes; the envelope needs some of them.
MAX_DATA_BYTES = 7000
# An SSE `event:` field: no line breaks, nothing a client would trip on.
TYPE_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9_.:-]{0,63}$")


@dataclass(frozen=True)
class Ephemeral:
    run_id: UUID
    type: str
    data: Any
    step: int | None = None  # the seq of the step that sent it


def encode(run_id: UUID, type: str, data: Any, *, step: int | None = None) -> str:
    """The NOTIFY payload of an update; ValueError for a bad type or data that is not JSON or too big."""
    if not isinstance(type, str) or not TYPE_PATTERN.match(type):
        raise ValueError(
            "an emitted event's type is a name of letters, digits and . _ : - (at most 64)"
        )
    try:
        data_json, _ = dumps_storable(data)
    except TypeError as exc:
        raise ValueError(f"an emitted event's data must be JSON: {exc}") from None
    if len(data_json.encode()) > MAX_DATA_BYTES:
        raise ValueError(
            f"an emitted event's data is over {MAX_DATA_BYTES} bytes of JSON; send less, or store it"
        )
    step_json = "null" if step is None else str(int(step))
    return f'{{"run":"{run_id}","type":{json.dumps(type)},"step":{step_json},"data":{data_json}}}'


def send(run_id: UUID, payload: str) -> None:
    """Push one ``encode``d update to the run's streams (if anyone watches it); commits at once."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.send_ephemeral, {"channel": EVENTS_CHANNEL, "payload": payload, "run": run_id}
        )


def decode(payload: str) -> tuple[UUID, Ephemeral | None] | None:
    """A notification on the streams' channel: (run id, None) for a wake-up, (run id, update) for an update."""
    try:
        if not payload.startswith("{"):
            return UUID(payload), None
        message = json.loads(payload)
        run_id = UUID(message["run"])
        step = message.get("step")
        return run_id, Ephemeral(
            run_id=run_id,
            type=str(message["type"]),
            data=message.get("data"),
            step=step if isinstance(step, int) else None,
        )
    except (ValueError, KeyError, TypeError):
        return None
