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
