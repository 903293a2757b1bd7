"""Kinds and Django tasks of tests/runs/tasks/test_core_defects.py: code that tries to end the process it runs in.

Worker processes import this module through AGENT_MODULES; the test process
imports it to submit runs of its kinds and enqueue its tasks.
"""

from __future__ import annotations

import sys

from django.tasks import task

from workers import RunContext, agent

# How each way out reads in the run's error.
SHOWN_AS = {
    "sys.exit(3)": "SystemExit(3)",
    "KeyboardInterrupt": "KeyboardInterrupt()",
    "exit()": "SystemExit(None)",
}


def leave(how: str) -> None:
    """End the program the way a script would: ``sys.exit(3)``, Ctrl-C's exception, or the ``exit()`` builtin."""
    if how == "sys.exit(3)":
        sys.exit(3)
    if how == "KeyboardInterrupt":
        raise KeyboardInterrupt
    exit()  # noqa: PLR1722 - the builtin a script calls, not sys.exit


@agent("exits_in_step")
def exits_in_step(ctx: RunContext, data: dict) -> dict:
    """A step that tries to end the worker process."""
    ctx.step("prepare", lambda: "ready")
    ctx.step("leave", leave, data["how"])
    return {"unreachable": True}


@agent("exits_between_steps")
def exits_between_steps(ctx: RunContext, data: dict) -> dict:
    """Agent code that tries to end the worker process after a step, outside any step."""
    ctx.step("prepare", lambda: "ready")
    leave(data["how"])
    return {"unreachable": True}


@task
def exits(how: str) -> None:
    leave(how)


@task
def note(path: str, label: str) -> str:
    """Append ``label`` to the file ``path``: the order in which a worker ran the tasks."""
    with open(path, "a") as out:
        out.write(label + "\n")
    return label
