"""What a running run reads back: its step log (for replay) and its inbox."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runs import payloads
from runs.db import engine_cursor
from runs.queries import queries, rows

# At most this many messages are handed to one `message` step; the rest wait
# for the next one (a run's inbox is read in bounded pages).
MESSAGES_PER_STEP = 100


@dataclass(frozen=True)
class RecordedStep:
    seq: int
    name: str
    status: str
    output: Any
    idempotency_key: str = ""
    kind: str = "custom"


def load_step_log(*, run_id: UUID, generation: int) -> dict[int, RecordedStep]:
    """The run's recorded steps in its current generation, read once per claim."""
    with engine_cursor() as cursor:
        cursor.execute(queries.load_step_log, {"run": run_id, "generation": generation})
        found = rows(cursor)
    return {
        row["seq"]: RecordedStep(
            **row | {"output": payloads.resolve_json(row["output"], run_id=run_id)}
        )
        for row in found
    }


def unconsumed_messages(run_id: UUID, *, limit: int = MESSAGES_PER_STEP) -> list[dict]:
    """The run's oldest messages no step consumed yet, at most ``limit``."""
    with engine_cursor() as cursor:
        cursor.execute(queries.unconsumed_messages, {"run": run_id, "limit": limit})
        found = rows(cursor)
    return [
        {
            "id": row["id"],
            "text": row["text"],
            "author": f"{row['author_type']}:{row['author_id']}",
            "at": row["created_at"].isoformat(),
        }
        for row in found
    ]
