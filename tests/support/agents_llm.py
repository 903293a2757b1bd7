"""Agent kinds for the LLM runtime tests: a tool loop the fake provider drives (AGENT_MODULES)."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from workers import RunContext, agent
from workers.llm import ToolError, run_agent_loop, tool

MARKER = "END-OF-DUMP"


@tool
def tick(i: int) -> dict:
    """Count one tick."""
    return {"tick": i}


@tool
def hold(path: str) -> str:
    """Wait while the file at ``path`` exists (the test kills the worker meanwhile)."""
    while os.path.exists(path):
        time.sleep(0.05)
    return "released"


@tool
def dump(size: int) -> str:
    """Return ``size`` bytes of text, ending with a marker."""
    line = "0123456789 the quick brown fox jumps over the lazy dog\n"
    body = (line * (size // len(line) + 1))[: max(0, size - len(MARKER))]
    return body + MARKER


@tool
def broken(reason: str) -> str:
    """Always answers with a tool error."""
    raise ToolError(reason)


class LoopIn(BaseModel):
    prompt: str = "go"
    max_iterations: int = 25


def _loop(ctx: RunContext, data: LoopIn) -> dict:
    result = run_agent_loop(
        ctx,
        system="You are a test agent.",
        user=data.prompt,
        tools=[tick, hold, dump, broken],
        max_iterations=data.max_iterations,
    )
    return result.to_dict()


@agent("llm_agent", input_schema=LoopIn)
def llm_agent(ctx: RunContext, data: LoopIn) -> dict:
    """A tool loop for the fake provider to drive."""
    return _loop(ctx, data)


@agent("llm_agent_short_timeout", input_schema=LoopIn, step_timeout=1.5)
def llm_agent_short_timeout(ctx: RunContext, data: LoopIn) -> dict:
    """The same loop with 1.5 s step timeouts (a hung model call times out)."""
    return _loop(ctx, data)
