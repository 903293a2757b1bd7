"""Agent kinds used by the test suite (AGENT_MODULES=tests.agents in the test session).

Steps append one line per execution to the file named by the input's
``log``, outside the database, so a test can count how often each step of
each run really executed, including executions whose worker was killed.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel, Field

from workers import Fatal, Retryable, RunContext, agent


def record(log: str | None, run_id, seq: int, name: str) -> None:
    if not log:
        return
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, f"{run_id} {seq} {name} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


def executions(log) -> list[tuple[str, int, str, int]]:
    """Parsed lines of an execution log: (run id, seq, step name, pid)."""
    if not os.path.exists(log):
        return []
    rows = []
    with open(log) as fh:
        for line in fh:
            run_id, seq, name, pid = line.split()
            rows.append((run_id, int(seq), name, int(pid)))
    return rows


class StepsIn(BaseModel):
    steps: int = Field(default=9, ge=1, le=200)
    log: str | None = None
    step_seconds: float = 0.0
    block_at: int | None = None  # this step blocks while block_file exists
    block_file: str | None = None


def _work(log, run_id, seq, name, seconds, block):
    record(log, run_id, seq, name)
    if block and block[1] and os.path.exists(block[1]):
        # Blocks while the file exists (the test kills or releases us meanwhile).
        while os.path.exists(block[1]):
            time.sleep(0.05)
    if seconds:
        time.sleep(seconds)
    return {"seq": seq, "name": name}


@agent("steps", input_schema=StepsIn)
def steps(ctx: RunContext, data: StepsIn) -> dict:
    """N named steps; each records its execution in the log file."""
    ctx.progress(total=data.steps)
    outputs = []
    for seq in range(1, data.steps + 1):
        name = f"step{seq}"
        block = (seq, data.block_file) if data.block_at == seq else None
        outputs.append(ctx.step(name, _work, data.log, str(ctx.run_id), seq, name, data.step_seconds, block))
    return {"steps": len(outputs), "last": outputs[-1]}


@agent("noop3")
def noop3(ctx: RunContext, data: dict) -> dict:
    """Three no-op steps: the shape of the throughput benchmark."""
    for name in ("one", "two", "three"):
        ctx.step(name, lambda: None)
    return {"ok": True}


class EchoIn(BaseModel):
    text: str = Field(min_length=1, max_length=1000)
    times: int = Field(default=1, ge=1, le=10)


@agent("echo", input_schema=EchoIn, queue="default")
def echo(ctx: RunContext, data: EchoIn) -> dict:
    """Repeat the text."""
    return {"echo": ctx.step("repeat", lambda: data.text * data.times)}


@agent("flaky")
def flaky(ctx: RunContext, data: dict) -> dict:
    """Fails with a retryable error in its step until `succeed_after` attempts have been made."""
    attempt = ctx.attempt

    def call():
        if attempt <= data.get("fail_times", 1):
            raise Retryable("upstream answered 503", retry_after=0)
        return "ok"

    ctx.step("first", lambda: "first")
    return {"call": ctx.step("call", call)}


@agent("broken")
def broken(ctx: RunContext, data: dict) -> dict:
    """A step that fails for good."""
    ctx.step("validate", lambda: (_ for _ in ()).throw(Fatal("the CRM rejected the record: field 'email' is invalid")))
    return {}
