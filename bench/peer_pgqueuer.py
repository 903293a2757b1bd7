"""PGQueuer's side of bench/peers.py: the factory ``pgq run`` starts, and its two entrypoints.

Worker (as bench/peers.py starts it, one OS process each)::

    BENCH_PEER_DSN=postgres://.../bench_<pid>_pgqueuer \\
        .venv/bin/python -m bench.peer_pgqueuer --batch-size 5 --max-concurrent-tasks 10

which does what ``pgq run bench.peer_pgqueuer:main --log-level WARNING
--batch-size 5 --max-concurrent-tasks 10`` does after parsing its options:
set up PGQueuer's logger, then ``pgqueuer.run(factory, ...)`` (PGQueuer's
documented way to start a worker without the CLI) on the CLI's own event
loop runner (uvloop). ``pgq run`` itself fails here before it starts: with
the installed typer (0.29) its ``--log-level`` option reaches
``setup_fancy_logger`` as a str, not a ``LogLevel`` (AttributeError: 'str'
object has no attribute 'name'), even when the option is not given.

``main`` is the async context manager ``pgq run`` expects: a ``PgQueuer``
over one connection, as PGQueuer's documentation shows. The driver is
``BENCH_PGQUEUER_DRIVER``: ``asyncpg`` (default; what ``pgq`` itself tries
first) or ``psycopg`` (``PsycopgDriver`` over a psycopg 3
``AsyncConnection``). With psycopg, its NOTIFY watcher holds the connection
for up to 1 s at a time (``notifies(timeout=1.0)``) and takes it back before
the woken dequeue can run, so an idle worker picks a new job up about 1 s
late. LISTEN/NOTIFY is always on. Entrypoints must be ``async``; the payload
is JSON bytes.
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager

NOOP = "noop"
PING = "ping"


def driver_name() -> str:
    return os.environ.get("BENCH_PGQUEUER_DRIVER", "asyncpg")


async def connect_driver():
    """(driver, close) for BENCH_PEER_DSN, with the driver BENCH_PGQUEUER_DRIVER names."""
    dsn = os.environ["BENCH_PEER_DSN"]
    if driver_name() == "psycopg":
        import psycopg
        from pgqueuer.db import PsycopgDriver

        connection = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        return PsycopgDriver(connection), connection.close
    import asyncpg
    from pgqueuer.db import AsyncpgDriver

    connection = await asyncpg.connect(dsn)
    return AsyncpgDriver(connection), connection.close


@asynccontextmanager
async def main():
    from pgqueuer import PgQueuer
    from pgqueuer.models import Job

    from bench.peer_ping import send_ping

    driver, close = await connect_driver()
    try:
        pgq = PgQueuer(driver)

        @pgq.entrypoint(NOOP)
        async def noop(job: Job) -> None:
            """The drain job: nothing."""
            return None

        @pgq.entrypoint(PING)
        async def ping(job: Job) -> None:
            """The dispatch probe: one UDP datagram to the bench."""
            data = json.loads(job.payload)
            send_ping(data["seq"], data["port"])

        yield pgq
    finally:
        await close()


def run_worker(argv: list[str] | None = None) -> None:
    """``pgq run bench.peer_pgqueuer:main`` without the CLI's option parsing (see the module docstring)."""
    import argparse
    from datetime import timedelta

    import pgqueuer
    from pgqueuer.adapters.cli.cli import asyncio_run
    from pgqueuer.core import logconfig
    from pgqueuer.domain.types import QueueExecutionMode

    parser = argparse.ArgumentParser(description="a PGQueuer worker for bench/peers.py")
    parser.add_argument(
        "--batch-size", type=int, default=10, help="jobs dequeued at once (pgq run default 10)"
    )
    parser.add_argument(
        "--max-concurrent-tasks",
        type=int,
        default=None,
        help="jobs this worker holds at most (pgq run default: unlimited)",
    )
    parser.add_argument(
        "--dequeue-timeout", type=float, default=30.0, help="seconds to wait for a NOTIFY (30)"
    )
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logconfig.setup_fancy_logger(logconfig.LogLevel[args.log_level.upper()])
    asyncio_run(
        pgqueuer.run(
            main,
            dequeue_timeout=timedelta(seconds=args.dequeue_timeout),
            batch_size=args.batch_size,
            mode=QueueExecutionMode.continuous,
            max_concurrent_tasks=args.max_concurrent_tasks,
        )
    )


if __name__ == "__main__":
    run_worker()
