"""Procrastinate's side of bench/peers.py: the App and its two tasks.

Worker (as bench/peers.py starts it, one OS process each)::

    BENCH_PEER_DSN=postgres://.../bench_<pid>_procrastinate \\
        .venv/bin/procrastinate --app=bench.peer_procrastinate.app --log-level=warning \\
        worker --queues bench --concurrency 10

The connector is Procrastinate's ``PsycopgConnector`` (a psycopg 3
``AsyncConnectionPool``; the sync ``defer()`` of the bench's client opens
its sync counterpart). The pool has ``BENCH_POOL_SIZE`` connections (the
bench sets the worker's to its concurrency + 1, so no job waits for a
connection; LISTEN uses a connection of its own). The tasks are ``async``
(Procrastinate's native kind: a sync task would run in a thread).
"""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

from bench.peer_ping import send_ping

QUEUE = "bench"
_size = int(os.environ.get("BENCH_POOL_SIZE", "4"))

app = App(
    connector=PsycopgConnector(
        conninfo=os.environ.get("BENCH_PEER_DSN", ""),
        min_size=_size,
        max_size=_size,
    )
)


@app.task(name="noop", queue=QUEUE)
async def noop(i: int) -> None:
    """The drain job: nothing."""
    return None


@app.task(name="ping", queue=QUEUE)
async def ping(seq: int, port: int) -> None:
    """The dispatch probe: one UDP datagram to the bench."""
    send_ping(seq, port)
