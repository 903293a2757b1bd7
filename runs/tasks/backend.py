"""``DurableTaskBackend``: Django's task API on this engine's queue.

    TASKS = {
        "default": {
            "BACKEND": "runs.tasks.DurableTaskBackend",
            "QUEUES": ["default", "emails"],        # Django's own option; [] lets a task name any queue
            "OPTIONS": {
                "TENANT": "tasks",                  # the tenant its runs belong to (created on first use)
                "MAX_RUNNING": 100,                 # that tenant's limits, when this creates it
                "MAX_QUEUED": 100000,
                "MAX_ATTEMPTS": 3,                  # retry budget (default RUNS_MAX_ATTEMPTS)
                "TIMEOUT": 600,                     # seconds a task may run (default RUNS_STEP_TIMEOUT_SECONDS)
            },
        },
    }

``enqueue`` writes the run in the caller's transaction (it commits or rolls
back with the caller's writes) and answers a READY ``TaskResult`` whose id
is the run's; ``get_result`` reads it back. Tasks run on ``runworker``
(``--queues`` names the task queues too), appear on the dashboard and in
the admin as runs of kind ``<module>.<function>``, and can be cancelled,
retried and inspected like any run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from django.core import checks
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils.json import normalize_json
from django.utils.module_loading import import_string

from runs.registry import QUEUE_NAME, declare_queues
from runs.tasks import results
from runs.tasks.discovery import task_for

if TYPE_CHECKING:
    from django.tasks import Task, TaskResult

    from runs.models import Tenant

# Run.kind's length: a task's dotted path must fit.
MAX_KIND_LENGTH = 100
TENANT_SLUG = "tasks"


class DurableTaskBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict):
        super().__init__(alias, params)
        self.tenant_slug = self.options.get("TENANT", TENANT_SLUG)
        self.max_running = int(self.options.get("MAX_RUNNING", 100))
        self.max_queued = int(self.options.get("MAX_QUEUED", 100_000))
        self.max_attempts = self.options.get("MAX_ATTEMPTS")
        self.timeout = self.options.get("TIMEOUT")
        # Runs may be submitted to the queues this backend lists, used by a kind or not.
        declare_queues(name for name in self.queues if QUEUE_NAME.match(name))

    def validate_task(self, task: Task) -> None:
        """Django's checks, then this engine's (queue names, path length); registers the task's kind."""
        super().validate_task(task)
        if not QUEUE_NAME.match(task.queue_name):
            raise InvalidTask(
                f"queue name {task.queue_name!r} is not valid here: use up to 64 lowercase letters, digits, "
                "'_', '-' and '.'"
            )
        if len(task.module_path) > MAX_KIND_LENGTH:
            raise InvalidTask(
                f"the task's dotted path is longer than {MAX_KIND_LENGTH} characters: {task.module_path}"
            )
        from runs.tasks.execution import register_kind

        register_kind(task, step_timeout=self.timeout)
        declare_queues([task.queue_name])

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        from runs.services import submit

        self.validate_task(task)
        # TypeError for what JSON cannot hold; a dict normalises to a dict.
        data = cast(dict[str, Any], normalize_json({"args": args, "kwargs": kwargs}))
        if self.alias != "default":
            data["backend"] = self.alias
        if task.run_after is not None:
            data["run_after"] = (
                task.run_after.isoformat()
            )  # read back by get_result (results.enqueued_task)
        tenant = self.tenant()
        # submit, not submit_run: tenant_is_fresh (the tenant was just read) is not a public option.
        run = submit(
            tenant=tenant,
            kind=task.module_path,
            input=data,
            queue=task.queue_name,
            priority=results.run_priority(task.priority),
            run_after=task.run_after,
            max_attempts=self.max_attempts,
            tenant_is_fresh=True,
        ).run
        result = results.build_result(
            task=task,
            run_id=run.pk,
            status=results.TaskResultStatus.READY,
            enqueued_at=run.created_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=data["args"],
            kwargs=data["kwargs"],
            alias=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        """The task's run as a ``TaskResult``; ``TaskResultDoesNotExist`` for any id that is not one of its tasks."""
        return self.result_of(result_id, tenant_slug=self.tenant_slug)

    def result_of(self, result_id: str, *, tenant_slug: str | None) -> TaskResult:
        """``get_result`` in ``tenant_slug`` (None: any tenant, for the worker running a task's run of any tenant)."""
        from runs.tasks.history import task_run

        found = task_run(result_id, tenant_slug=tenant_slug)
        task = task_for(found.run.kind) if found is not None else None
        if found is None or task is None:
            raise TaskResultDoesNotExist(result_id)
        return results.from_run(
            found.run, task=task, alias=self.alias, errors=found.errors, worker_ids=found.worker_ids
        )

    def tenant(self) -> Tenant:
        """The tenant this backend's runs belong to, created (with MAX_RUNNING, MAX_QUEUED) on first use."""
        # Read on every enqueue (one indexed lookup; its counters serve the backpressure check):
        # a cached row goes stale when the tenant is deleted and made again.
        from runs.models import Tenant

        tenant, _ = Tenant.objects.get_or_create(
            slug=self.tenant_slug,
            defaults={
                "name": "Django tasks",
                "max_running": self.max_running,
                "max_queued": self.max_queued,
            },
        )
        return tenant

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = list(super().check(**kwargs))
        for name in sorted(self.queues):
            if not QUEUE_NAME.match(name):
                messages.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}] lists the queue {name!r}, which is not a valid queue name here",
                        hint="Use up to 64 lowercase letters, digits, '_', '-' and '.'.",
                        id="runs.E101",
                    )
                )
        return messages


def durable_aliases() -> list[str]:
    """The ``TASKS`` aliases whose backend is this one."""
    from django.conf import settings

    aliases = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        try:
            backend = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue
        if isinstance(backend, type) and issubclass(backend, DurableTaskBackend):
            aliases.append(alias)
    return aliases


def autodiscover_tasks() -> None:
    """Import every installed app's ``tasks`` module when a ``TASKS`` backend is this one."""
    if durable_aliases():
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("tasks")
