"""Agent kinds used by the benchmarks (AGENT_MODULES=bench.agents in every bench process).

All of them are no-ops apart from what the benchmark measures: the cost
measured is the engine's (claim, step log, checkpoints, exit), not the work.
"""

from __future__ import annotations

import time

from workers import RunContext, agent


def _now() -> dict:
    # Wall clock on purpose: compared with the submitting process's commit
    # time on the same machine.
    return {"t": time.time()}


def _noop(i: int) -> dict:
    return {"i": i}


@agent("bench_noop", queue="bench_accept")
def bench_noop(ctx: RunContext, data: dict) -> dict:
    """Accept-latency kind: never executed by the benchmark (no worker listens on its queue)."""
    return {}


@agent("bench_probe", queue="bench_dispatch")
def bench_probe(ctx: RunContext, data: dict) -> dict:
    """Dispatch-latency probe: its one step records when it started."""
    return ctx.step("first", _now)


@agent("bench_steps", queue="bench_tp")
def bench_steps(ctx: RunContext, data: dict) -> dict:
    """Throughput kind: ``data["steps"]`` (default 3) checkpointed no-op steps."""
    n = int(data.get("steps", 3))
    ctx.progress(total=n)
    for i in range(n):
        ctx.step(f"s{i + 1}", _noop, i)
    return {"steps": n}


def _slow(seconds: float) -> dict:
    # A stand-in for a slow model call: the step holds no database connection
    # while it sleeps. Its start and end (wall clock, compared with the bench
    # process's on the same machine) let bench/inflight.py count exactly how
    # many steps were executing at any moment.
    started = time.time()
    if seconds > 0:
        time.sleep(seconds)
    return {"t0": started, "t1": time.time()}


@agent("bench_slow", queue="bench_slow")
def bench_slow(ctx: RunContext, data: dict) -> dict:
    """In-flight kind: ``data["fast"]`` (default 0) no-op steps, then ``data["steps"]`` (default 1)
    steps that each sleep ``data["sleep"]`` seconds (default 2)."""
    n = int(data.get("steps", 1))
    fast = int(data.get("fast", 0))
    seconds = float(data.get("sleep", 2))
    ctx.progress(total=fast + n)
    for i in range(fast):
        ctx.step(f"fast{i + 1}", _noop, i)
    for i in range(n):
        ctx.step(f"slow{i + 1}", _slow, seconds)
    return {"steps": fast + n}


# bench/chaos.py: runs with a keyed and an unkeyed side effect, drained while
# workers are SIGKILLed. Each effect is a row written on the process's own
# autocommit connection (not the engine's), committed before the step checkpoints.
_chaos_conn = None
_chaos_lock = None


def _chaos_sql(query: str, params: tuple) -> None:
    global _chaos_conn, _chaos_lock
    import os
    import threading

    import psycopg

    if _chaos_lock is None:
        _chaos_lock = threading.Lock()
    with _chaos_lock:
        if _chaos_conn is None or _chaos_conn.closed:
            _chaos_conn = psycopg.connect(os.environ["DATABASE_URL"], autocommit=True)
        _chaos_conn.execute(query, params)


def _chaos_pause(base: float) -> None:
    import random

    time.sleep(base * random.uniform(0.66, 1.66))  # about 20-50 ms for base 0.03


def _chaos_plain(sleep: float) -> dict:
    _chaos_pause(sleep)
    return {"ok": True}


def _chaos_keyed(ctx: RunContext, run_id: str, sleep: float) -> dict:
    """A callee idempotent by key: every attempt is logged, the effect applies once per key."""
    import os

    key = ctx.idempotency_key
    _chaos_pause(sleep / 2)
    _chaos_sql(
        "INSERT INTO bench_chaos_attempts (run_id, step, key, pid) VALUES (%s, 'keyed', %s, %s)",
        (run_id, key, os.getpid()),
    )
    _chaos_sql(
        "INSERT INTO bench_chaos_keyed (key, run_id, pid) VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING",
        (key, run_id, os.getpid()),
    )
    _chaos_pause(sleep / 2)
    return {"key": key}


def _chaos_unkeyed(run_id: str, sleep: float) -> dict:
    import os

    _chaos_pause(sleep / 2)
    _chaos_sql(
        "INSERT INTO bench_chaos_unkeyed (run_id, pid) VALUES (%s, %s)", (run_id, os.getpid())
    )
    _chaos_pause(sleep / 2)
    return {"ok": True}


@agent("bench_chaos", queue="bench_chaos")
def bench_chaos(ctx: RunContext, data: dict) -> dict:
    """Chaos kind: a plain step, a keyed side effect, an unkeyed side effect (each sleeps ~``data["sleep"]``)."""
    sleep = float(data.get("sleep", 0.03))
    run_id = str(ctx.run_id)
    ctx.progress(total=3)
    ctx.step("plain", _chaos_plain, sleep)
    keyed = ctx.step(
        "keyed", lambda: _chaos_keyed(ctx, run_id, sleep), side_effect=True, idempotency_key=True
    )
    ctx.step("unkeyed", _chaos_unkeyed, run_id, sleep, side_effect=True)
    return {"key": keyed["key"]}


# bench/peers.py: the dispatch probe measured side by side with the peers
# (Procrastinate, PGQueuer, django-tasks-db), whose tasks run the same body.
def _ping(seq: int, port: int) -> dict:
    from bench.peer_ping import send_ping

    send_ping(seq, port)
    return {"seq": seq}


@agent("bench_ping", queue="bench_ping")
def bench_ping(ctx: RunContext, data: dict) -> dict:
    """Peers dispatch probe: its first step sends a UDP datagram with ``data["seq"]`` to 127.0.0.1:``data["port"]``."""
    return ctx.step("ping", _ping, int(data["seq"]), int(data["port"]))
