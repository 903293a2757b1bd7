"""Agent kinds for the human-control tests: approvals, messages, long steps."""

from __future__ import annotations

import os
import time

from tests.support.agents import executions, record
from workers import Ambiguous, Fatal, Retryable, RunContext, StepResult, agent


@agent("approve_then_act")
def approve_then_act(ctx: RunContext, data: dict) -> dict:
    """Draft, ask for approval, then act only when approved."""
    log = data.get("log")
    draft = ctx.step(
        "draft", lambda: (record(log, ctx.run_id, 1, "draft"), {"fields": {"stage": "won"}})[1]
    )
    decision = ctx.approval("update_crm", proposal=draft)
    if not decision.approved:
        return {"applied": False, "comment": decision.comment, "by": decision.by}
    ctx.step(
        "update_crm",
        lambda: record(log, ctx.run_id, 3, "update_crm"),
        side_effect=True,
        idempotency_key=True,
    )
    return {"applied": True, "comment": decision.comment, "by": decision.by}


@agent("chat")
def chat(ctx: RunContext, data: dict) -> dict:
    """Wait for messages until one says 'bye'; answer each."""
    seen = []
    while True:
        for message in ctx.wait_for_message():
            seen.append(message["text"])
            if message["text"] == "bye":
                return {"seen": seen}
            ctx.step(f"answer:{len(seen)}", lambda text=message["text"]: f"you said {text}")


@agent("long_steps")
def long_steps(ctx: RunContext, data: dict) -> dict:
    """Steps that poll ctx.cancelled while they wait on a file (a long model call)."""
    steps = data.get("steps", 3)
    log, hold = data.get("log"), data.get("hold_file")

    def work(seq):
        record(log, ctx.run_id, seq, f"step{seq}")
        while hold and os.path.exists(hold) and not ctx.cancelled:
            time.sleep(0.05)
        return {"seq": seq, "stopped_early": ctx.cancelled}

    outputs = [ctx.step(f"step{seq}", work, seq) for seq in range(1, steps + 1)]
    return {"outputs": outputs}


def _wait_while(path: str | None) -> None:
    while path and os.path.exists(path):
        time.sleep(0.05)


@agent("approve_then_hold")
def approve_then_hold(ctx: RunContext, data: dict) -> dict:
    """Draft, ask for approval, then act in a step that waits while `hold_file` exists (a test kills it there)."""
    log, hold = data.get("log"), data.get("hold_file")
    run_id = str(ctx.run_id)
    ctx.step("draft", lambda: (record(log, run_id, 1, "draft"), {"amount": 42})[1])
    decision = ctx.approval("pay", proposal={"amount": 42, "to": "ACME"})

    def act():
        record(log, run_id, 3, "act")
        _wait_while(hold)
        return decision.approved

    ctx.step("act", act)
    return {"approved": decision.approved, "comment": decision.comment, "by": decision.by}


@agent("uncertain_charge")
def uncertain_charge(ctx: RunContext, data: dict) -> dict:
    """prepare → charge (a side effect that is ambiguous on its first execution) → finish."""
    log = data.get("log")
    run_id = str(ctx.run_id)

    def charge(amount):
        first = not any(r == run_id and seq == 2 for r, seq, _, _ in executions(log))
        record(log, run_id, 2, "charge")
        if first:
            raise Ambiguous("the payment provider closed the connection after accepting the charge")
        return {"receipt": "from-the-retry", "amount": amount}

    ctx.step("prepare", lambda: record(log, run_id, 1, "prepare"))
    charged = ctx.step("charge", charge, 42, side_effect=True)
    ctx.step("finish", lambda: record(log, run_id, 3, "finish"))
    return {"charged": charged}


@agent("inbox")
def inbox(ctx: RunContext, data: dict) -> dict:
    """Wait for messages, then handle them in a step that records what it received and holds on `hold_file`."""
    log, hold = data.get("log"), data.get("hold_file")
    run_id = str(ctx.run_id)
    received = ctx.wait_for_message()
    texts = [m["text"] for m in received]

    def handle():
        # One log line per execution, naming what this execution was given (texts have no spaces).
        record(log, run_id, 2, "handle:" + "|".join(texts))
        _wait_while(hold)
        return len(texts)

    ctx.step("handle", handle)
    return {"handled": texts, "ids": [m["id"] for m in received]}


@agent("priced_calls", backoff_base=0.05, backoff_cap=0.1)
def priced_calls(ctx: RunContext, data: dict) -> dict:
    """`steps` model calls costing `cents` each. Call `fail_at` fails (fatal, or retryable) while
    `fail_file` exists; call `hold_at` waits while `hold_file` exists."""
    log = data.get("log")
    run_id = str(ctx.run_id)

    def call(seq):
        record(log, run_id, seq, f"call{seq}")
        if seq == data.get("hold_at"):
            _wait_while(data.get("hold_file"))
        if seq == data.get("fail_at") and os.path.exists(data.get("fail_file") or ""):
            if data.get("error") == "retryable":
                raise Retryable("upstream answered 503", retry_after=0)
            raise Fatal("the CRM rejected the record: field 'email' is invalid")
        return StepResult(
            {"seq": seq}, tokens_in=100, tokens_out=10, cost_cents=data.get("cents", 10)
        )

    return {
        "calls": [
            ctx.step(f"call{seq}", call, seq)["seq"] for seq in range(1, data.get("steps", 4) + 1)
        ]
    }
