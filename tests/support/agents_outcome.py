"""Agent kinds of tests/workers/test_outcome.py and tests/runs/test_search.py: reports (ctx.report) and titles.

Imported by those tests (in process) and named in AGENT_MODULES of the
worker processes they start.
"""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from tests.support.agents import record
from workers import Fatal, Retryable, RunContext, RunOutcome, agent


class ReportIn(BaseModel):
    summary: str = "Did the thing"
    outcome: str = "succeeded"
    log: str | None = None
    # After reporting: a step that blocks while this file exists (a test kills the worker meanwhile)...
    block_file: str | None = None
    # ...fails once with a retryable error while this file does not exist yet (it is created then)...
    flaky_marker: str | None = None
    # ...or the run fails for good.
    fail: bool = False
    report_twice: bool = False


def _after(log, run_id, block_file, flaky_marker):
    record(log, run_id, 2, "after")
    if block_file:
        while os.path.exists(block_file):
            time.sleep(0.05)
    if flaky_marker and not os.path.exists(flaky_marker):
        open(flaky_marker, "w").close()
        raise Retryable("the service is busy, try again")
    return {"ok": True}


@agent("reporter", input_schema=ReportIn, max_attempts=3, backoff_base=0.01, backoff_cap=0.05)
def reporter(ctx: RunContext, data: ReportIn) -> dict:
    """A step, a report, then another step (that may block, fail once, or be followed by a failure)."""
    run_id = str(ctx.run_id)
    ctx.step("before", lambda: record(data.log, run_id, 1, "before"))
    if data.report_twice:
        ctx.report("first thought", outcome=RunOutcome.PARTIAL)
    ctx.report(data.summary, outcome=data.outcome)
    ctx.step("after", _after, data.log, run_id, data.block_file, data.flaky_marker)
    if data.fail:
        raise Fatal("the last check failed after the work was done")
    return {"ok": True}


@agent("silent")
def silent(ctx: RunContext, data: dict) -> dict:
    """Finishes without reporting."""
    ctx.step("work", lambda: None)
    return {"ok": True}


@agent("titled_by_function", title=lambda data: f"Order {data['order']} for {data['customer']}")
def titled_by_function(ctx: RunContext, data: dict) -> dict:
    return {}


@agent("titled_by_field", title="customer")
def titled_by_field(ctx: RunContext, data: dict) -> dict:
    return {}


@agent("title_raises", title=lambda data: data["missing"])
def title_raises(ctx: RunContext, data: dict) -> dict:
    return {}


@agent("title_not_text", title=lambda data: 42)
def title_not_text(ctx: RunContext, data: dict) -> dict:
    return {}


@agent("spawns_titled")
def spawns_titled(ctx: RunContext, data: dict) -> dict:
    """One child titled by its kind's function, gathered."""
    child = ctx.spawn(
        "titled_by_function", {"order": data["order"], "customer": "Child Corp"}, key="c"
    )
    ctx.gather([child])
    return {}


@agent("reports_then_rolls_back", compensate_on=("fatal",))
def reports_then_rolls_back(ctx: RunContext, data: dict) -> dict:
    """Creates something (undone by its compensation), reports it, then fails for good: the rollback undoes it."""
    ctx.step("create", lambda: {"id": 1}, compensate=lambda created: {"deleted": created["id"]})
    ctx.report("Created the record")
    raise Fatal("the check after the write failed")
