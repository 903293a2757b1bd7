"""The run page's facts in words that agree with its timeline: the step it is on, its counters, each
step's badge, its input as rows.

Plain functions of a run and its step rows, like ``runs.dashboard.presenters``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from runs.models import Run, RunStatus, Step, StepStatus


def failed_tries(run: Run) -> str:
    """The retry budget once something failed ("1 of 3 failed"), else "".

    ``attempt`` counts claims, and a run is claimed again after every
    approval, message or sleep: "attempt 2 of 3" would read as a failed try.
    """
    if not run.failures:
        return ""
    return f"{run.failures} of {run.max_attempts} failed"


def steps_count(run: Run) -> str:
    """ "3 of 5", or "10 steps" when the agent announced no total."""
    if run.steps_total:
        return f"{run.steps_done} of {run.steps_total}"
    return f"{run.steps_done} step{'s' if run.steps_done != 1 else ''}"


@dataclass(frozen=True)
class NowStep:
    """The step the run page names at the top: the one in progress, the one it waits on, or the last one."""

    label: str  # "Current step", "Waiting on", "Last step"
    name: str
    state: str  # a badge class: running, waiting, done, ...


def now_step(run: Run, last: Step | None) -> NowStep | None:
    """What ``current_step`` means for the run's state, told apart with the last step row.

    Between steps ``current_step`` names the last finished step, and a slow
    step shows there before its row exists: the row says which one it is.
    """
    if run.is_terminal or not run.current_step:
        return None
    recorded = last if last is not None and last.name == run.current_step else None
    if run.status == RunStatus.RUNNING:
        if recorded is not None and recorded.status == StepStatus.DONE:
            return NowStep("Last step", run.current_step, "done")
        return NowStep("Current step", run.current_step, "running")
    if recorded is not None and recorded.status == StepStatus.WAITING:
        return NowStep("Waiting on", run.current_step, "waiting")
    return NowStep(
        "Last step", run.current_step, recorded.status if recorded is not None else "done"
    )


@dataclass(frozen=True)
class StepBadge:
    css: str  # the badge-<css> class
    label: str


# What a step that waited is called once its run ended without it.
_NEVER_FINISHED = {
    "approval": "Never decided",
    "message": "Stopped waiting",
    "child": "Stopped waiting",
    "sleep": "Cut short",
}


def step_badge(step: Step, run: Run) -> StepBadge:
    """A step's status as the timeline words it: an approval says how it was decided, and a step left
    waiting or running by a run that ended says so instead of "Waiting"."""
    if step.kind == "approval" and step.status == StepStatus.DONE and isinstance(step.output, dict):
        if step.output.get("approved") is True:
            return StepBadge("done", "Approved")
        if step.output.get("approved") is False:
            return StepBadge("rejected", "Rejected")
    if run.is_terminal and step.status == StepStatus.WAITING:
        return StepBadge("cancelled", _NEVER_FINISHED.get(step.kind, "Stopped"))
    if run.is_terminal and step.status == StepStatus.RUNNING:
        return StepBadge("cancelled", "Interrupted")
    if step.status == StepStatus.COMPENSATED:
        return StepBadge("compensated", "Undone")
    return StepBadge(step.status, step.get_status_display())


def step_in_progress(run: Run, steps: list[Step]) -> str:
    """The name of a step that is executing but has no row yet (a step is written when it ends), or ""."""
    if run.status != RunStatus.RUNNING or not run.current_step:
        return ""
    if steps and steps[-1].name == run.current_step:
        return ""  # between steps, current_step names the last finished one
    return run.current_step


@dataclass(frozen=True)
class InputRow:
    label: str
    text: str
    long: bool  # shown as a paragraph, not on one line


MAX_INPUT_ROWS = 30
MAX_INPUT_TEXT = 2_000


def input_rows(data: Any) -> list[InputRow]:
    """A run's input as labelled rows: strings as text, lists of strings joined, anything else as compact JSON.

    Bounded (the first 30 fields, 2,000 characters each); the raw JSON stays one click away.
    """
    if not isinstance(data, dict):
        return (
            [InputRow("Input", _cut(json.dumps(data, ensure_ascii=False, default=str)), True)]
            if data
            else []
        )
    rows = []
    for name, value in list(data.items())[:MAX_INPUT_ROWS]:
        if isinstance(value, str):
            text = value
        elif isinstance(value, list) and all(isinstance(item, str) for item in value):
            text = "\n".join(value)
        else:
            text = json.dumps(value, ensure_ascii=False, default=str)
        text = _cut(text)
        rows.append(
            InputRow(str(name).replace("_", " ").capitalize(), text, len(text) > 80 or "\n" in text)
        )
    return rows


def _cut(text: str) -> str:
    return text if len(text) <= MAX_INPUT_TEXT else text[: MAX_INPUT_TEXT - 1] + "…"
