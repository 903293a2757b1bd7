"""Agent kinds of tests/workers/test_step_options.py: a step's options apart from its function's arguments.

Every step function notes each call it receives in the file named by the
input's ``log`` (outside the database), so a test counts how often it ran.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from tests.support.agents import note
from workers import RunContext, agent


class OptionsIn(BaseModel):
    log: str
    case: str = ""
    side_effect: bool = False


def fetch(log: str, url: str, timeout: float | None = None) -> dict:
    note(log, called="fetch", url=url, timeout=timeout)
    return {"url": url}


def slow(log: str, seconds: float) -> dict:
    note(log, called="slow")
    time.sleep(seconds)
    return {"slept": seconds}


@agent("step_kwargs", input_schema=OptionsIn, max_attempts=1)
def step_kwargs(ctx: RunContext, data: OptionsIn) -> dict:
    """``fetch`` gets its own ``timeout`` through ``kwargs=``; the step's ``timeout`` bounds the step."""
    ctx.step(
        "fetch", fetch, data.log, "https://example.invalid/a", kwargs={"timeout": 7}, timeout=5
    )
    ctx.step("slow", slow, data.log, kwargs={"seconds": 3}, timeout=0.5)
    return {}


def act(log: str, **extra) -> dict:
    """Takes any keyword, as a client's ``request(url, **options)`` does: an option passed on is accepted."""
    note(log, called="act", extra=sorted(extra))
    return {"acted": True}


# One bad option each; ctx.step must refuse it before calling ``act`` or writing anything.
BAD_OPTIONS = {
    "kind": {"kind": "LLM"},
    "unknown": {"retries": 3},
    "timeout": {"timeout": 0},
}


@agent(
    "step_bad_option", input_schema=OptionsIn, max_attempts=3, backoff_base=0.05, backoff_cap=0.1
)
def step_bad_option(ctx: RunContext, data: OptionsIn) -> dict:
    ctx.step("first", note, data.log, kwargs={"called": "first"})
    ctx.step("act", act, data.log, side_effect=data.side_effect, **BAD_OPTIONS[data.case])
    return {}


@agent("step_refused", input_schema=OptionsIn, max_attempts=3, backoff_base=0.05, backoff_cap=0.1)
def step_refused(ctx: RunContext, data: OptionsIn) -> dict:
    """One step whose checkpoint the database refuses (a trigger of the test): ``case`` is plain, unkeyed or keyed."""

    def refused(log: str) -> dict:
        note(log, called="refused", key=ctx.idempotency_key)
        return {"done": True}

    ctx.step(
        "refused act",
        refused,
        data.log,
        side_effect=data.case != "plain",
        idempotency_key=True if data.case == "keyed" else None,
    )
    return {}
