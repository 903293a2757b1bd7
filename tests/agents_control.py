"""Agent kinds for the human-control tests: approvals, messages, long steps."""

from __future__ import annotations

import os
import time

from workers import RunContext, agent
from tests.agents import record


@agent("approve_then_act")
def approve_then_act(ctx: RunContext, data: dict) -> dict:
    """Draft, ask for approval, then act only when approved."""
    log = data.get("log")
    draft = ctx.step("draft", lambda: (record(log, ctx.run_id, 1, "draft"), {"fields": {"stage": "won"}})[1])
    decision = ctx.approval("update_crm", proposal=draft)
    if not decision.approved:
        return {"applied": False, "comment": decision.comment, "by": decision.by}
    ctx.step("update_crm", lambda: record(log, ctx.run_id, 3, "update_crm"), side_effect=True, idempotency_key=True)
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
