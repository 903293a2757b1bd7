"""The Worker rows: a worker process registers at start, is marked seen by its heartbeat
(``runs.engine.claim.heartbeat``) and stopped at exit."""

from __future__ import annotations

import os
import socket
from uuid import UUID

from django.db import connection

from runs.queries import queries


def register_worker(
    *, worker_id: UUID, queues: list[str], kinds: list[str], concurrency: int, lease: float
) -> None:
    """The worker's row, with its first lease (``lease`` seconds; its heartbeat renews it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.register_worker,
            {
                "worker": worker_id,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "queues": queues,
                "kinds": sorted(kinds),
                "concurrency": concurrency,
                "lease": lease,
            },
        )


def worker_stopped(*, worker_id: UUID) -> None:
    with connection.cursor() as cursor:
        cursor.execute(queries.worker_stopped, {"worker": worker_id})
