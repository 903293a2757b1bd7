"""Agent kinds used by the test suite (AGENT_MODULES=tests.support.agents in the test session).

Steps append one line per execution to the file named by the input's
``log``, outside the database, so a test can count how often each step of
each run really executed, including executions whose worker was killed.
"""

from __future__ import annotations

import json
import os
import time
import uuid

from django.db import connection
from pydantic import BaseModel, Field

from workers import Ambiguous, Fatal, Retryable, RunContext, StepResult, agent


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
        outputs.append(
            ctx.step(name, _work, data.log, str(ctx.run_id), seq, name, data.step_seconds, block)
        )
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
    ctx.step(
        "validate",
        lambda: (_ for _ in ()).throw(
            Fatal("the CRM rejected the record: field 'email' is invalid")
        ),
    )
    return {}


# ---------------------------------------------------------------------------
# Kinds of tests/workers/test_failures.py and tests/workers/test_bounds.py: error classes,
# timeouts, side effects and bounds. Their steps write JSON lines with `note`
# (the key a side effect saw, which process ran it), read back with `notes`.
# ---------------------------------------------------------------------------

# The table an idempotent callee keeps its effects in; tests create it (tests/support/failure_helpers.py).
LEDGER_TABLE = "test_effect_ledger"


def note(log: str | None, **fields) -> None:
    """Append one JSON line to ``log`` (one write, so concurrent writers do not interleave)."""
    if not log:
        return
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, (json.dumps(fields) + "\n").encode())
    finally:
        os.close(fd)


def notes(log, **match) -> list[dict]:
    """The lines `note` wrote to ``log`` whose fields equal ``match``."""
    if not os.path.exists(log):
        return []
    with open(log) as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [row for row in rows if all(row.get(k) == v for k, v in match.items())]


def _wait_while(path: str | None) -> None:
    while path and os.path.exists(path):
        time.sleep(0.05)


class InventoryGlitch(Exception):
    """An exception the classifier has never heard of."""


def _raise(error: str, data) -> None:
    if error == "retryable":
        raise Retryable(
            "upstream answered 503",
            retry_after=data.retry_after,
            tokens_in=1000,
            tokens_out=20,
            cost_cents=data.cost_cents,
        )
    if error == "http429":
        import requests

        response = requests.Response()
        response.status_code = 429
        response.headers["retry-after-ms"] = "500"
        raise requests.HTTPError("429 Too Many Requests", response=response)
    if error == "fatal":
        raise Fatal("the CRM rejected the record: field 'email' is invalid")
    if error == "keyerror":
        raise KeyError("customer_id")
    if error == "unknown":
        raise InventoryGlitch("inventory service returned a negative stock level")
    raise AssertionError(f"unknown error {error!r}")


class FlakyCallIn(BaseModel):
    log: str | None = None
    fail_times: int = 0  # the call fails on the first `fail_times` attempts
    error: str = "retryable"  # retryable | http429 | fatal | keyerror | unknown
    retry_after: float | None = None
    cost_cents: float = 0  # usage the provider reported with a retryable failure


@agent("flaky_call", input_schema=FlakyCallIn, max_attempts=10, backoff_base=0.1, backoff_cap=0.8)
def flaky_call(ctx: RunContext, data: FlakyCallIn) -> dict:
    """before → call (fails on the first fail_times attempts) → after."""
    run_id, attempt = str(ctx.run_id), ctx.attempt

    def call(what):
        note(data.log, run=run_id, step="call", attempt=attempt)
        if attempt <= data.fail_times:
            _raise(data.error, data)
        return StepResult({"called": what}, tokens_in=10, tokens_out=5, cost_cents=1)

    ctx.step("before", lambda: note(data.log, run=run_id, step="before"))
    result = ctx.step("call", call, "quote")
    ctx.step("after", lambda: note(data.log, run=run_id, step="after"))
    return result


class BumpyIn(BaseModel):
    log: str
    steps: int = 7
    # A step fails with a 429 on as many of its first executions as it is listed here.
    failing: list[int] = [2, 4, 6]


@agent("bumpy", input_schema=BumpyIn, max_attempts=2, backoff_base=0.02, backoff_cap=0.05)
def bumpy(ctx: RunContext, data: BumpyIn) -> dict:
    """A long run that meets unrelated transient errors along the way."""
    run_id = str(ctx.run_id)

    def work(seq):
        before = len(notes(data.log, run=run_id, seq=seq))
        note(data.log, run=run_id, seq=seq)
        if before < data.failing.count(seq):
            raise Retryable(f"step {seq}: 429 Too Many Requests")
        return seq

    return {"done": [ctx.step(f"step{seq}", work, seq) for seq in range(1, data.steps + 1)]}


# The same agent with a cap far above its base, so that the backoff's exponent shows.
agent("bumpy_backoff", input_schema=BumpyIn, max_attempts=5, backoff_base=0.05, backoff_cap=2)(
    bumpy
)


class SlowCallIn(BaseModel):
    log: str
    side_effect: bool = False
    keyed: bool = False
    timeout: float | None = None  # overrides the kind's step_timeout
    first_sleep: float = 0.8  # the first execution of `send` takes this long
    explicit_ambiguous: bool = False


@agent("slow_call", input_schema=SlowCallIn, step_timeout=0.3, backoff_base=0.05, backoff_cap=0.1)
def slow_call(ctx: RunContext, data: SlowCallIn) -> dict:
    """prepare → send (slow the first time, or raising Ambiguous) → confirm."""
    run_id = str(ctx.run_id)

    def send(message):
        key = ctx.idempotency_key  # read at once: the engine forgets it when the step times out
        first = not notes(data.log, run=run_id, step="send")
        note(data.log, run=run_id, step="send", key=key, pid=os.getpid())
        if data.explicit_ambiguous:
            raise Ambiguous(
                "the payment provider closed the connection after accepting the request"
            )
        if first:
            time.sleep(data.first_sleep)
        return {"sent": message, "key": key}

    ctx.step("prepare", lambda: "ready")
    sent = ctx.step(
        "send",
        send,
        "hello",
        side_effect=data.side_effect,
        idempotency_key=True if data.keyed else None,
        timeout=data.timeout,
    )
    ctx.step("confirm", lambda: "confirmed")
    return sent


class EffectIn(BaseModel):
    log: str
    keyed: bool = False
    block_file: str | None = None  # the charge waits, after its effect, while this file exists


@agent("effect", input_schema=EffectIn)
def effect(ctx: RunContext, data: EffectIn) -> dict:
    """prepare → charge (a side effect on an idempotent ledger) → finish."""
    run_id = str(ctx.run_id)

    def charge(amount):
        key = ctx.idempotency_key
        note(data.log, run=run_id, step="charge", key=key, pid=os.getpid())
        # The callee honours the key; without one every call is a new effect.
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {LEDGER_TABLE} (key, run_id, pid, amount) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (key) DO NOTHING",
                [key or f"unkeyed:{uuid.uuid4()}", run_id, os.getpid(), amount],
            )
        _wait_while(data.block_file)
        return {"charged": amount}

    ctx.step("prepare", lambda: "ready")
    charged = ctx.step(
        "charge", charge, 42, side_effect=True, idempotency_key=True if data.keyed else None
    )
    ctx.step("finish", lambda: note(data.log, run=run_id, step="finish", pid=os.getpid()))
    return charged


class HangIn(BaseModel):
    block_file: str


@agent("hang", input_schema=HangIn, step_timeout=0.5)
def hang(ctx: RunContext, data: HangIn) -> dict:
    """A step whose thread never returns (until the test removes the file)."""
    return ctx.step("hang", _wait_while, data.block_file)


class CountedIn(BaseModel):
    log: str
    steps: int = 10


@agent("limited_steps", input_schema=CountedIn, max_steps=5)
def limited_steps(ctx: RunContext, data: CountedIn) -> dict:
    """Wants more steps than its kind allows."""
    run_id = str(ctx.run_id)
    for seq in range(1, data.steps + 1):
        ctx.step(f"step{seq}", note, data.log, kwargs={"run": run_id, "seq": seq})
    return {}


@agent("llm_loop", input_schema=CountedIn, max_model_iterations=3)
def llm_loop(ctx: RunContext, data: CountedIn) -> dict:
    """A model/tool loop that never converges."""
    run_id = str(ctx.run_id)
    for i in range(1, data.steps + 1):
        ctx.step(
            f"model{i}", note, data.log, kwargs={"run": run_id, "step": "model", "i": i}, kind="llm"
        )
        ctx.step(
            f"tool{i}", note, data.log, kwargs={"run": run_id, "step": "tool", "i": i}, kind="tool"
        )
    return {}


class SpendIn(BaseModel):
    log: str | None = None
    steps: int = 10
    cents: float = 30


@agent("spender", input_schema=SpendIn)
def spender(ctx: RunContext, data: SpendIn) -> dict:
    """Model calls of `cents` each."""
    run_id = str(ctx.run_id)

    def call(seq):
        note(data.log, run=run_id, seq=seq)
        return StepResult({"seq": seq}, tokens_in=100, tokens_out=10, cost_cents=data.cents)

    return {"calls": [ctx.step(f"call{seq}", call, seq) for seq in range(1, data.steps + 1)]}


def _released(wrapper, within: float) -> bool:
    # Runs on the step thread, looking at the run thread's connection.
    deadline = time.monotonic() + within
    while wrapper.connection is not None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@agent("fast_then_slow")
def fast_then_slow(ctx: RunContext, data: dict) -> dict:
    """A no-op step, then a step that reports whether the run's thread handed its connection back."""
    from django.db import connections

    run_thread_connection = connections["default"]
    # Its checkpoint is written by the worker's committer (workers.committer), on a connection of its own.
    ctx.step("fast", lambda: {"ok": True})
    released = ctx.step("slow", _released, run_thread_connection, float(data.get("within", 1.0)))
    return {"released": released}


@agent("logs_in_step")
def logs_in_step(ctx: RunContext, data: dict) -> dict:
    """A step that logs from inside, as a library or agent code would, and opens a span; then a line between steps."""
    import logging

    def greet(name: str) -> dict:
        logging.getLogger("tests.support.agents").info("greeting %s from inside the step", name)
        try:
            from opentelemetry import trace
        except ImportError:
            return {"greeted": name}
        with trace.get_tracer("tests.support.agents").start_as_current_span("inside greet"):
            return {"greeted": name}

    greeted = ctx.step("greet", greet, data.get("name", "world"))
    logging.getLogger("tests.support.agents").info("greeted %s, between steps", greeted["greeted"])
    return greeted
