"""What a task's run looks like through Django's eyes: priorities, statuses, ``TaskResult`` and its errors.

Priorities. Django's run from -100 to 100, higher first, 0 by default; a
run's from 0 to 9, lower first, 5 by default. Django's default maps onto
ours, every positive priority runs ahead of it and every negative one
behind it, in bands: 1..20 → 4, 21..40 → 3, 41..60 → 2, 61..80 → 1,
81..100 → 0; -1..-25 → 6, -26..-50 → 7, -51..-75 → 8, -76..-100 → 9. Read
back (``TaskResult.task.priority``) a band gives its outer end (4 → 20,
6 → -25), so a priority inside a band comes back rounded away from 0.

Statuses. ``queued``, ``paused`` and the waiting ones are READY (enqueued,
or ready to run again after a retry's backoff); ``running`` is RUNNING;
``done`` is SUCCESSFUL; ``failed`` and ``cancelled`` are FAILED.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.tasks.base import Task, TaskError, TaskResult, TaskResultStatus
from django.tasks.exceptions import InvalidTask

from runs import payloads

if TYPE_CHECKING:
    from runs.models import Run

DEFAULT_RUN_PRIORITY = 5

_STATUS = {
    "running": TaskResultStatus.RUNNING,
    "done": TaskResultStatus.SUCCESSFUL,
    "failed": TaskResultStatus.FAILED,
    "cancelled": TaskResultStatus.FAILED,
}


def run_priority(task_priority: int) -> int:
    """Django's priority (-100..100, higher first) as a run's (0..9, lower first); see the module docstring."""
    if task_priority > 0:
        return DEFAULT_RUN_PRIORITY - math.ceil(task_priority / 20)
    if task_priority < 0:
        return DEFAULT_RUN_PRIORITY + math.ceil(-task_priority / 25)
    return DEFAULT_RUN_PRIORITY


def task_priority(run_priority: int) -> int:
    """A run's priority as Django's: the outer end of the band that maps onto it."""
    if run_priority < DEFAULT_RUN_PRIORITY:
        return (DEFAULT_RUN_PRIORITY - run_priority) * 20
    return -(run_priority - DEFAULT_RUN_PRIORITY) * 25


def task_status(run_status: str) -> TaskResultStatus:
    return _STATUS.get(run_status, TaskResultStatus.READY)


@functools.lru_cache(maxsize=1024)
def as_enqueued(task: Task, *, queue: str, priority: int, alias: str) -> Task:
    """The task as its run was enqueued: its queue, its priority read back, the backend alias.

    Cached (a ``Task`` is frozen): ``using()`` has Django validate the copy again, signature included,
    which cost more than the rest of a no-op task's bookkeeping.
    """
    try:
        return task.using(priority=task_priority(priority), queue_name=queue, backend=alias)
    except InvalidTask:  # an operator moved the run to a queue the backend does not list
        return task


def enqueued_task(task: Task, *, queue: str, priority: int, alias: str, data: Any) -> Task:
    """``as_enqueued``, with the ``run_after`` it was enqueued with (kept in the run's input: ``Run.run_after``
    moves on with retries and sleeps)."""
    enqueued = as_enqueued(task, queue=queue, priority=priority, alias=alias)
    run_after = data.get("run_after") if isinstance(data, dict) else None
    if not isinstance(run_after, str):
        return enqueued
    try:
        # Not cached: each deferred task has its own, and only those pay for Django's validation again.
        return enqueued.using(run_after=datetime.fromisoformat(run_after))
    except (
        ValueError,
        InvalidTask,
    ):  # edited by hand into something else: read back as not deferred
        return enqueued


def build_result(
    *,
    task: Task,
    run_id: Any,
    status: TaskResultStatus,
    enqueued_at: datetime | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    last_attempted_at: datetime | None,
    args: list,
    kwargs: dict,
    alias: str,
    errors: list[TaskError],
    worker_ids: list[str],
    return_value: Any = None,
) -> TaskResult:
    result: TaskResult = TaskResult(
        task=task,
        id=str(run_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    object.__setattr__(result, "_return_value", return_value)  # as Django's own backends set it
    return result


def from_run(
    run: Run, *, task: Task, alias: str, errors: list[str], worker_ids: list[str]
) -> TaskResult:
    """The ``TaskResult`` of a task's run, with its step attempts' errors and the workers that claimed it."""
    data = payloads.resolve(run.input, run_id=run.pk)
    data = data if isinstance(data, dict) else {}
    return build_result(
        task=enqueued_task(task, queue=run.queue, priority=run.priority, alias=alias, data=data),
        run_id=run.pk,
        status=task_status(run.status),
        enqueued_at=run.created_at,
        started_at=run.started_at,
        finished_at=run.finished_at,
        last_attempted_at=run.claimed_at,
        args=data.get("args", []),
        kwargs=data.get("kwargs", {}),
        alias=alias,
        errors=[task_error(text) for text in errors],
        worker_ids=worker_ids,
        return_value=payloads.resolve(run.result, run_id=run.pk) if run.status == "done" else None,
    )


def finished(
    result: TaskResult, *, status: TaskResultStatus, at: datetime, return_value: Any
) -> TaskResult:
    """``result`` (a running task's) as its run ended."""
    done = replace(result, status=status, finished_at=at)
    object.__setattr__(
        done, "_return_value", return_value if status == TaskResultStatus.SUCCESSFUL else None
    )
    return done


def task_error(text: str) -> TaskError:
    """A step attempt's error (``Name: message`` then the traceback, workers.recording) as Django's ``TaskError``.

    The traceback's last exception line names the class with its module
    (``myapp.tasks.Unreachable: ...``; a builtin's bare, ``ValueError: ...``):
    that gives ``exception_class_path``.
    """
    head, _, traceback = text.partition("\n\n")
    name = head.partition(":")[0].strip()
    traceback = traceback or text
    path = f"builtins.{name}" if name.isidentifier() else "builtins.Exception"
    pattern = (
        re.compile(rf"^((?:[A-Za-z_][\w]*\.)*){re.escape(name)}(?::|$)", re.MULTILINE)
        if name
        else None
    )
    if pattern is not None:
        found = [match.group(1) for match in pattern.finditer(traceback)]
        if found and found[-1]:
            path = f"{found[-1]}{name}"
    return TaskError(exception_class_path=path, traceback=traceback)
