"""Agent kinds of tests/runs/engine/test_edges.py: the engine's promises at its edges (AGENT_MODULES in the test session)."""

from __future__ import annotations

import os
import time

import psycopg
from django.db import connections
from pydantic import BaseModel

from tests.support.agents import note
from workers import Ambiguous, RunContext, StepResult, agent

HOSTILE = "before\u0000middle\ud800after"


class LogIn(BaseModel):
    log: str
    seconds: float = 0.0


@agent("occupy")
def occupy(ctx: RunContext, data: dict) -> dict:
    """One step that holds its tenant slot for ``seconds`` and writes when it ran (wall clock)."""

    def hold(log: str, seconds: float) -> dict:
        started = time.time()
        time.sleep(seconds)
        note(log, run=str(ctx.run_id), start=started, end=time.time(), pid=os.getpid())
        return {"held": seconds}

    return ctx.step("hold", hold, data["log"], data.get("seconds", 0.3))


@agent("hostile_text")
def hostile_text(ctx: RunContext, data: dict) -> dict:
    """A model that answers with NUL and a lone surrogate, and costs money."""

    def call_model(prompt: str) -> StepResult:
        note(data["log"], run=str(ctx.run_id), step="model", pid=os.getpid())
        return StepResult(
            {"text": HOSTILE, HOSTILE: [HOSTILE], "n": float("nan")},
            tokens_in=10,
            tokens_out=5,
            cost_cents=7,
        )

    answer = ctx.step(f"ask {HOSTILE}", call_model, HOSTILE, kind="llm")
    return {"answer": answer["text"], "echo": HOSTILE}


@agent("hostile_error", max_attempts=1)
def hostile_error(ctx: RunContext, data: dict) -> dict:
    """A tool that fails with a message a database text column refuses."""

    def tool() -> None:
        raise ValueError(f"tool said {HOSTILE}")

    return ctx.step("tool", tool)


@agent("doubt_between_steps")
def doubt_between_steps(ctx: RunContext, data: dict) -> dict:
    """Agent code (not a step) says it cannot tell whether something happened."""
    ctx.step("look", lambda: "looked")
    if not ctx.step("decided", lambda: data.get("sure", False)):
        raise Ambiguous("the remote said 'maybe': did the transfer go through?")
    return {"ok": True}


def _kill_worker_connections(attempt: int, log: str) -> dict:
    """On the first attempt, terminate every database connection of this worker process.

    Uses a connection of its own, so that the pool's connections (the one the
    checkpoint of this very step will take) are all dead when it returns.
    """
    if attempt == 1:
        params = connections["default"].get_connection_params()
        for key in ("cursor_factory", "context", "pool", "prepare_threshold"):
            params.pop(key, None)
        params["application_name"] = "test killer"
        with psycopg.connect(**params, autocommit=True) as conn:
            killed = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = 'agentruns runworker' AND datname = current_database()"
            ).fetchone()[0]
        note(log, attempt=attempt, killed=killed)
    return {"attempt": attempt}


@agent("failover", max_attempts=1)
def failover(ctx: RunContext, data: dict) -> dict:
    """A step during which the database drops the worker's connections (a failover)."""
    first = ctx.step("work", _kill_worker_connections, ctx.attempt, data["log"])
    ctx.step("after", lambda: "after")
    return first


class HeldIn(BaseModel):
    block_file: str
    seconds: float = 2.0


def _wait_for_file(path: str) -> str:
    while os.path.exists(path):
        time.sleep(0.02)
    return "released"


@agent("reclaimed", input_schema=HeldIn)
def reclaimed(ctx: RunContext, data: HeldIn) -> dict:
    """Step 1 blocks on a file; step 2 is long, so that a missed heartbeat would lose the lease."""
    ctx.step("block", _wait_for_file, data.block_file)
    ctx.step("long", time.sleep, data.seconds)
    return {"done": True}


@agent("many_messages")
def many_messages(ctx: RunContext, data: dict) -> dict:
    """Reads its inbox twice: each read is one bounded page."""
    first = ctx.messages()
    second = ctx.messages()
    return {"first": len(first), "second": len(second)}
