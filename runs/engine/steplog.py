"""What a running run reads back: its step log (for replay) and its inbox."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from runs.db import engine_cursor, loads

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
        cursor.execute(
            "SELECT seq, name, status, output, idempotency_key, kind FROM runs_step"
            " WHERE run_id = %s AND generation = %s ORDER BY seq",
            [run_id, generation],
        )
        rows = cursor.fetchall()
    return {
        seq: RecordedStep(
            seq=seq, name=name, status=status, output=loads(output), idempotency_key=key, kind=kind
        )
        for seq, name, status, output, key, kind in rows
    }


def unconsumed_messages(run_id: UUID, *, limit: int = MESSAGES_PER_STEP) -> list[dict]:
    """The run's oldest messages no step consumed yet, at most ``limit``."""
    with engine_cursor() as cursor:
        cursor.execute(
            "SELECT id, text, author_type, author_id, created_at FROM runs_message"
            " WHERE run_id = %s AND consumed_by_step_id IS NULL ORDER BY id LIMIT %s",
            [run_id, limit],
        )
        rows = cursor.fetchall()
    return [
        {"id": pk, "text": text, "author": f"{author_type}:{author_id}", "at": created.isoformat()}
        for pk, text, author_type, author_id, created in rows
    ]
