"""A task's kind: what a worker does with a run enqueued through Django's task API.

The run is one step named after the function: the task is called inside
``ctx.step``, so its return value is checkpointed with the step, an
exception is classified like any step's (a connection error or an HTTP 5xx
is retried with backoff, ``ValueError`` fails the task at once; raise
``workers.Retryable`` or ``workers.Fatal`` to say it yourself), and a
worker that dies mid-task leaves a lease the reaper returns to the queue:
the task runs again, at least once in all. Django's ``task_started`` is
sent before the call, on every attempt; ``task_finished`` once the exit
that ends the run is committed (``after_exit``), in the worker.

Nothing here imports the execution layer: ``ctx`` is the worker's
``RunContext``, used through its public attributes only.
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from django.tasks import TaskContext, TaskResultStatus, task_backends
from django.tasks.signals import task_finished, task_started
from django.utils.json import normalize_json

from runs.registry import AgentKind, register
from runs.tasks import results
from runs.tasks.discovery import remember, task_for

if TYPE_CHECKING:
    from datetime import datetime

    from django.tasks import Task, TaskResult


def register_kind(task: Task, *, step_timeout: float | None) -> None:
    """Make ``task`` a kind, once per function (Django validates each ``using()`` copy again)."""
    if not remember(task):
        return
    module_path = task.module_path

    def execute(ctx, data: dict) -> Any:
        return _execute(ctx, data, module_path=module_path)

    def after_exit(ctx, status: str, result: Any, at: datetime) -> None:
        _after_exit(ctx, status, result, at, module_path=module_path)

    # Named as the task, so that the registry tells two functions of one name apart by their paths.
    for hook in (execute, after_exit):
        hook.__module__, hook.__qualname__ = task.func.__module__, task.func.__qualname__
    register(
        AgentKind(
            name=module_path,
            func=execute,
            queue=task.queue_name,
            step_timeout=step_timeout,
            description=(task.func.__doc__ or "").strip(),
            title=functools.partial(title, task.name),
            after_exit=after_exit,
            public=False,  # code enqueues a task with the arguments it chooses; a tenant never does
        )
    )


def title(name: str, data: dict) -> str:
    """``send_welcome_email(42, plan="pro")``: the run's title in lists."""
    args = [json.dumps(value, ensure_ascii=False) for value in data.get("args", [])]
    args += [
        f"{key}={json.dumps(value, ensure_ascii=False)}"
        for key, value in data.get("kwargs", {}).items()
    ]
    return f"{name}({', '.join(args)})"


def arguments(data: Any) -> tuple[list, dict]:
    """The stored ``{"args": [...], "kwargs": {...}}`` (TypeError, which fails the run, if it is not that)."""
    args = data.get("args", []) if isinstance(data, dict) else None
    kwargs = data.get("kwargs", {}) if isinstance(data, dict) else None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise TypeError('a task run\'s input is {"args": [...], "kwargs": {...}}')
    return args, kwargs


def _backend(data: dict, task: Task) -> Any:
    return task_backends[data.get("backend") or task.backend]


def _execute(ctx, data: dict, *, module_path: str) -> Any:
    task = task_for(module_path)
    if task is None:
        raise LookupError(f"the task {module_path} is no longer defined")
    backend = _backend(data, task)
    args, kwargs = arguments(data)
    started = _running_result(ctx, task, backend, args, kwargs)
    task_started.send(type(backend), task_result=started)

    def call() -> Any:
        if task.takes_context:
            value = task.call(TaskContext(task_result=started), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        return normalize_json(
            value
        )  # a value JSON cannot hold fails the task, as with Django's backends

    return ctx.step(task.name, call, timeout=backend.timeout)


def _running_result(ctx, task: Task, backend: Any, args: list, kwargs: dict) -> TaskResult:
    """This attempt's ``TaskResult`` (RUNNING): built from the claim on a first attempt, read on a retry."""
    claim = ctx.claim
    if claim.attempt > 1:
        # The workers that claimed it before and the errors they met are in the database.
        return backend.result_of(claim.id, tenant_slug=None)
    return results.build_result(
        task=results.enqueued_task(
            task, queue=claim.queue, priority=claim.priority, alias=backend.alias, data=claim.input
        ),
        run_id=claim.id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=claim.created_at,
        started_at=claim.started_at,
        finished_at=None,
        last_attempted_at=claim.claimed_at,
        args=args,
        kwargs=kwargs,
        alias=backend.alias,
        errors=[],
        worker_ids=[str(ctx.worker_id)],
    )


def _after_exit(ctx, status: str, result: Any, at: datetime, *, module_path: str) -> None:
    task = task_for(module_path)
    if task is None:
        return
    backend = _backend(ctx.claim.input, task)
    if status == "done" and ctx.claim.attempt == 1:
        args, kwargs = arguments(ctx.claim.input)
        running = _running_result(ctx, task, backend, args, kwargs)
        ended = results.finished(
            running, status=TaskResultStatus.SUCCESSFUL, at=at, return_value=result
        )
    else:  # a failure, or a run claimed before: what the database knows, errors and workers included
        ended = backend.result_of(ctx.claim.id, tenant_slug=None)
    task_finished.send(type(backend), task_result=ended)
