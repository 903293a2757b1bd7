"""The client side of bench/peers.py: one system's Python submit path, in a process of its own.

    .venv/bin/python bench/peer_client.py SYSTEM bulk --n 5000 [--steps 3]
    .venv/bin/python bench/peer_client.py SYSTEM enqueue --n 2000 --warmup 20
    .venv/bin/python bench/peer_client.py SYSTEM dispatch --n 200 --warmup 10 --pause 0.02

SYSTEM is agentruns, agentruns-tasks, procrastinate, pgqueuer or django-tasks-db; the
environment (set by bench/peers.py) names its database. Every system gets
the same process, the same timing loop and the same clock
(``time.perf_counter``); only the one submit call differs:

- agentruns: ``runs.services.submit_run(...)`` inside ``transaction.atomic()``
- Procrastinate: ``task.defer(...)`` (its sync connector, a psycopg 3 pool of one)
- PGQueuer: ``Queries(driver).enqueue(...)``, the driver over one connection
  as in its worker (bench/peer_pgqueuer.py: asyncpg, or psycopg 3), awaited
  on a persistent event loop (``run_until_complete``: about 15 us a call)
- django-tasks-db: ``task.enqueue(...)`` (autocommit: one commit each)
- agentruns-tasks: the same ``task.enqueue(...)`` of the same module, on this
  project's django.tasks backend

``bulk`` enqueues the drain's jobs in one transaction (one statement per
1,000 jobs where the library has a batch call), untimed. ``enqueue`` submits
one by one, a commit each, and times it. ``dispatch`` submits ping jobs one
at a time and waits, after each, for the UDP datagram the job body sends
(bench/peer_ping.py) to a socket this process listens on. The last line
printed is ``RESULT {json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHUNK = 1000


class AgentRuns:
    def __init__(self) -> None:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        from django.db import transaction

        from runs.services import submit_run
        from runs.tenants import ensure_tenant

        self.transaction = transaction
        self.submit_run = submit_run
        self.tenant, _ = ensure_tenant(slug=os.environ.get("BENCH_TENANT", "bench-peers"))

    def bulk(self, n: int, steps: int) -> None:
        with self.transaction.atomic():
            for _ in range(n):
                self.submit_run(
                    tenant=self.tenant, kind="bench_steps", input={"steps": steps}, queue="bench_tp"
                )

    def submit(self, i: int) -> None:
        with self.transaction.atomic():
            self.submit_run(
                tenant=self.tenant, kind="bench_steps", input={"steps": 1}, queue="bench_tp"
            )

    def ping(self, seq: int, port: int) -> None:
        with self.transaction.atomic():
            self.submit_run(
                tenant=self.tenant,
                kind="bench_ping",
                input={"seq": seq, "port": port},
                queue="bench_ping",
            )

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class Procrastinate:
    def __init__(self) -> None:
        os.environ["BENCH_POOL_SIZE"] = "1"
        from bench.peer_procrastinate import app, noop, ping

        self.app, self.noop, self.ping_task = app, noop, ping
        app.open()

    def bulk(self, n: int, steps: int) -> None:
        for start in range(0, n, CHUNK):
            self.noop.batch_defer(*({"i": i} for i in range(start, min(n, start + CHUNK))))

    def submit(self, i: int) -> None:
        self.noop.defer(i=i)

    def ping(self, seq: int, port: int) -> None:
        self.ping_task.defer(seq=seq, port=port)

    def close(self) -> None:
        self.app.close()


class PGQueuer:
    def __init__(self) -> None:
        import asyncio

        from pgqueuer import Queries

        from bench.peer_pgqueuer import NOOP, PING, connect_driver

        self.names = (NOOP, PING)
        self.loop = asyncio.new_event_loop()
        driver, self._close = self.loop.run_until_complete(connect_driver())
        self.queries = Queries(driver)

    def bulk(self, n: int, steps: int) -> None:
        for start in range(0, n, CHUNK):
            ids = range(start, min(n, start + CHUNK))
            self.loop.run_until_complete(
                self.queries.enqueue(
                    [self.names[0]] * len(ids),
                    [json.dumps({"i": i}).encode() for i in ids],
                    [0] * len(ids),
                )
            )

    def submit(self, i: int) -> None:
        self.loop.run_until_complete(
            self.queries.enqueue(self.names[0], json.dumps({"i": i}).encode())
        )

    def ping(self, seq: int, port: int) -> None:
        self.loop.run_until_complete(
            self.queries.enqueue(self.names[1], json.dumps({"seq": seq, "port": port}).encode())
        )

    def close(self) -> None:
        self.loop.run_until_complete(self._close())
        self.loop.close()


class DjangoTasksDB:
    def __init__(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = "bench.peer_settings"
        import django

        django.setup()
        from django.db import transaction

        from bench.peer_djtasks import noop, ping

        self.transaction, self.noop, self.ping_task = transaction, noop, ping

    def bulk(self, n: int, steps: int) -> None:
        with self.transaction.atomic():
            for i in range(n):
                self.noop.enqueue(i)

    def submit(self, i: int) -> None:
        self.noop.enqueue(i)

    def ping(self, seq: int, port: int) -> None:
        self.ping_task.enqueue(seq, port)

    def close(self) -> None:
        from django.db import connections

        connections.close_all()


class AgentRunsTasks(DjangoTasksDB):
    """The same ``@task`` functions and calls as django-tasks-db's, on this project's backend (config.settings)."""

    def __init__(self) -> None:
        os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
        import django

        django.setup()
        from django.db import transaction

        from bench.peer_djtasks import noop, ping

        self.transaction, self.noop, self.ping_task = transaction, noop, ping


ADAPTERS = {
    "agentruns": AgentRuns,
    "agentruns-tasks": AgentRunsTasks,
    "procrastinate": Procrastinate,
    "pgqueuer": PGQueuer,
    "django-tasks-db": DjangoTasksDB,
}


def pct(values: list[float], q: float) -> float:
    from bench.common import pct as _pct

    return _pct(values, q)


def op_bulk(client, args) -> dict:
    t0 = time.perf_counter()
    client.bulk(args.n, args.steps)
    return {"n": args.n, "seconds": time.perf_counter() - t0}


def op_enqueue(client, args) -> dict:
    for i in range(args.warmup):
        client.submit(-1 - i)
    latencies = []
    started = time.perf_counter()
    for i in range(args.n):
        t0 = time.perf_counter()
        client.submit(i)
        latencies.append((time.perf_counter() - t0) * 1000)
    seconds = time.perf_counter() - started
    return {
        "n": args.n,
        "warmup": args.warmup,
        "seconds": seconds,
        "rate": args.n / seconds,
        "p50_ms": pct(latencies, 50),
        "p99_ms": pct(latencies, 99),
    }


def op_dispatch(client, args) -> dict:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]

    def one(seq: int) -> float | None:
        sock.setblocking(False)
        try:
            while True:  # a late datagram of an earlier job must not count for this one
                sock.recv(64)
        except BlockingIOError:
            pass
        sock.setblocking(True)
        t0 = time.perf_counter()
        client.ping(seq, port)
        submitted.append((time.perf_counter() - t0) * 1000)
        deadline = t0 + args.timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                return None
            sock.settimeout(left)
            try:
                data = sock.recv(64)
            except TimeoutError:
                return None
            if data == str(seq).encode():
                return (time.perf_counter() - t0) * 1000

    submitted: list[float] = []  # how long the submit call itself took
    warm_lost = 0
    for i in range(args.warmup):
        warm_lost += one(-1 - i) is None
        time.sleep(args.pause)
    del submitted[:]
    latencies, lost = [], 0
    for i in range(args.n):
        ms = one(i)
        if ms is None:
            lost += 1
        else:
            latencies.append(ms)
        time.sleep(args.pause)
    sock.close()
    return {
        "n": args.n,
        "warmup": args.warmup,
        "latencies_ms": latencies,
        "lost": lost,
        "warmup_lost": warm_lost,
        "submit_ms": submitted,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("system", choices=sorted(ADAPTERS))
    parser.add_argument("op", choices=["bulk", "enqueue", "dispatch"])
    parser.add_argument("--n", type=int, required=True)
    parser.add_argument("--steps", type=int, default=1, help="bulk: steps of this project's runs")
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.02, help="dispatch: seconds between jobs")
    parser.add_argument(
        "--timeout", type=float, default=10.0, help="dispatch: seconds to wait for a datagram"
    )
    args = parser.parse_args(argv)
    client = ADAPTERS[args.system]()
    try:
        result = {"bulk": op_bulk, "enqueue": op_enqueue, "dispatch": op_dispatch}[args.op](
            client, args
        )
    finally:
        client.close()
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
