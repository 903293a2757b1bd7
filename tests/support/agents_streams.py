"""Agent kinds for the event-stream tests: steps that take a while, report progress and emit updates."""

from __future__ import annotations

import time

from workers import RunContext, agent


@agent("chatty")
def chatty(ctx: RunContext, data: dict) -> dict:
    """``steps`` steps of ``pause`` seconds; each emits a tick as it starts and reports progress when done."""
    steps, pause = int(data.get("steps", 3)), float(data.get("pause", 0.3))
    ctx.progress(total=steps)
    for i in range(1, steps + 1):

        def work(i: int = i) -> int:
            ctx.emit("tick", {"i": i, "of": steps})
            time.sleep(pause)
            return i

        ctx.step(f"tick {i}", work)
        ctx.progress(message=f"{i} of {steps} done")
    return {"ticks": steps}
