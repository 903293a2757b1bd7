"""The Worker rows: a worker process registers at start, is marked seen by its heartbeat
(``runs.engine.claim.heartbeat``) and stopped at exit."""

from __future__ import annotations

import os
import socket
from uuid import UUID

from django.db import connection


def register_worker(
    *, worker_id: UUID, queues: list[str], kinds: list[str], concurrency: int
) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_worker (id, host, pid, queues, kinds, concurrency, started_at, last_seen_at, runs_held)"
            " VALUES (%s, %s, %s, %s, %s, %s, statement_timestamp(), statement_timestamp(), 0)",
            [worker_id, socket.gethostname(), os.getpid(), queues, sorted(kinds), concurrency],
        )


def worker_stopped(*, worker_id: UUID) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE runs_worker SET stopped_at = statement_timestamp(), runs_held = 0 WHERE id = %s",
            [worker_id],
        )
