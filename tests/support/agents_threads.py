"""Kinds that play the turns of a thread in the conversation tests (tests/runs/threads).

Their behaviour comes from the thread's state (a turn's input is its
thread and number): ``log`` where each turn notes what it did, ``gate`` a
directory where the file named after a turn's number holds it mid-step
(removed: the turn goes on), ``wait`` a turn waits for a message after its
first read.
"""

from __future__ import annotations

import os
import time

from tests.support.agents import note
from workers import Fatal, RunContext, agent


def _hold(gate: str | None, turn: int, ctx: RunContext) -> None:
    """Block while the gate file of this turn exists (a test holds the turn mid-step)."""
    path = os.path.join(gate, str(turn)) if gate else None
    while path and os.path.exists(path):
        time.sleep(0.02)


@agent("thread_echo", compensate_on=("fatal",), max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
def thread_echo(ctx: RunContext, data: dict) -> dict:
    """Read the messages, hold at the gate, read again, then reply with every text read.

    The state counts the turns that ended well; a message "close" closes the
    thread, "fail" fails the turn after its state patch (which must not apply).
    """
    assert ctx.thread is not None
    state = ctx.state
    log, turn = state.get("log"), ctx.thread.turn
    texts = [m["text"] for m in ctx.messages()]
    note(log, turn=turn, event="start", texts=list(texts), run=str(ctx.run_id), at=time.time())

    def work() -> dict:
        note(log, turn=turn, event="work", pid=os.getpid(), at=time.time())
        _hold(state.get("gate"), turn, ctx)
        return {"resource": f"r{turn}"}

    def undo(output: dict) -> dict:
        note(log, turn=turn, event="undo", resource=output["resource"], at=time.time())
        return {"undone": output["resource"]}

    ctx.step("work", work, compensate=undo)
    if state.get("wait") and not texts:
        texts += [m["text"] for m in ctx.wait_for_message(timeout=30)]
    texts += [m["text"] for m in ctx.messages()]
    history = ctx.history(limit=50)
    ctx.update_state(
        {"turns_ended": state.get("turns_ended", 0) + 1, "last": texts[-1] if texts else None}
    )
    ctx.reply("echo: " + " | ".join(texts))
    note(
        log,
        turn=turn,
        event="end",
        texts=texts,
        history=[h["text"] for h in history],
        at=time.time(),
    )
    if "close" in texts:
        ctx.close_thread("closed on request")
    if "fail" in texts:
        raise Fatal("asked to fail")
    return {"texts": texts}
