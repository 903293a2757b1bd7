"""Agent kinds of tests/workers/test_workflow.py: sagas, child runs, durable sleep and timed waits."""

from __future__ import annotations

import os
import time

from tests.support.agents import note
from workers import Fatal, RunContext, agent


def _hold(path: str | None, ctx: RunContext | None = None) -> None:
    """Block while ``path`` exists (a test's gate), or until the run is cancelled."""
    while path and os.path.exists(path):
        if ctx is not None and ctx.cancelled:
            return
        time.sleep(0.02)


@agent("wf_sleep")
def wf_sleep(ctx: RunContext, data: dict) -> dict:
    """A step, a durable sleep, a step."""
    log = data["log"]
    ctx.step("before", lambda: note(log, run=str(ctx.run_id), step="before", at=time.time()))
    ctx.sleep(data["seconds"])
    ctx.step("after", lambda: note(log, run=str(ctx.run_id), step="after", at=time.time()))
    return {"slept": data["seconds"]}


@agent("wf_wait")
def wf_wait(ctx: RunContext, data: dict) -> dict:
    """Wait for a message, at most ``timeout`` seconds."""
    got = ctx.wait_for_message(timeout=data["timeout"])
    return {"messages": [m["text"] for m in got]}


@agent("wf_child")
def wf_child(ctx: RunContext, data: dict) -> dict:
    """One step that notes itself, waits at a gate, and succeeds or fails."""

    def work() -> dict:
        note(data.get("log"), run=str(ctx.run_id), step="child", at=time.time())
        _hold(data.get("gate"), ctx)
        if data.get("fail"):
            raise Fatal(f"child {data.get('n')} failed")
        return {"n": data.get("n"), "cost": 1}

    result = ctx.step("work", work)
    ctx.step("finish", lambda: None)  # a step boundary after the gate, where a cancel is honoured
    return result


@agent("wf_parent")
def wf_parent(ctx: RunContext, data: dict) -> dict:
    """Spawn ``n`` wf_child runs, gather them (``min_success``, ``timeout``), and report."""
    children = [
        ctx.spawn(
            "wf_child",
            {
                "n": i,
                "log": data.get("log"),
                "gate": data.get("gate"),
                "fail": i in data.get("fail", []),
            },
            key=f"c{i}",
        )
        for i in range(data["n"])
    ]
    outcomes = ctx.gather(
        children, min_success=data.get("min_success"), timeout=data.get("timeout")
    )
    ctx.step("report", lambda: note(data.get("log"), run=str(ctx.run_id), step="report"))
    return {"statuses": [o.status for o in outcomes], "results": [o.result for o in outcomes]}


@agent("wf_saga", compensate_on=("fatal",), max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
def wf_saga(ctx: RunContext, data: dict) -> dict:
    """Steps 1..``steps``, each undone by its compensation; step ``fail_at`` fails for good.

    An undo blocks at ``gate`` when it is the ``gate_at`` step's; ``flaky_undo``
    fails that many times first (per step, counted in the log).
    """
    log = data["log"]

    def do(i: int) -> dict:
        note(log, run=str(ctx.run_id), action="do", step=i, at=time.time())
        if i == data.get("fail_at"):
            raise Fatal(f"step {i} cannot be done")
        return {"resource": f"r{i}"}

    def undo(i: int):
        def compensation(output: dict) -> dict:
            note(
                log,
                run=str(ctx.run_id),
                action="undo",
                step=i,
                resource=output["resource"],
                key=ctx.idempotency_key,
                at=time.time(),
                pid=os.getpid(),
            )
            if i == data.get("gate_at"):
                _hold(data.get("gate"))
            if i in data.get("fatal_undo", []):
                raise Fatal(f"cannot undo step {i}")
            return {"deleted": output["resource"]}

        return compensation

    for i in range(1, data["steps"] + 1):
        ctx.step(f"do {i}", do, i, compensate=undo(i))
        if data.get("wait_after") == i:
            ctx.step("wait", lambda: _hold(data.get("gate"), ctx))
    return {"done": data["steps"]}


@agent("wf_steps")
def wf_steps(ctx: RunContext, data: dict) -> dict:
    """``steps`` steps that note their execution; step ``fail_at`` fails unless the input says otherwise."""
    log = data["log"]
    seen = []
    for i in range(1, data["steps"] + 1):

        def work(i=i) -> dict:
            note(log, run=str(ctx.run_id), step=i)
            if i == data.get("fail_at"):
                raise Fatal(f"step {i} failed")
            return {"step": i}

        seen.append(ctx.step(f"step {i}", work)["step"])
    return {"steps": seen}


@agent("wf_cost_child")
def wf_cost_child(ctx: RunContext, data: dict) -> dict:
    from workers import StepResult

    return ctx.step("spend", lambda: StepResult({"spent": 30}, cost_cents=30))


@agent("wf_cost_parent")
def wf_cost_parent(ctx: RunContext, data: dict) -> dict:
    """Children that spend 30 cents each, then a 20-cent step of its own."""
    from workers import StepResult

    children = [ctx.spawn("wf_cost_child", {}, key=str(i)) for i in range(data["n"])]
    ctx.gather(children)
    ctx.step("summarise", lambda: StepResult({"ok": True}, cost_cents=20))
    ctx.step("after", lambda: None)
    return {"ok": True}
