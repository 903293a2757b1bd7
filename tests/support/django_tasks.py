"""Django ``@task`` functions of tests/runs/tasks/test_backend.py, on the project's DurableTaskBackend (TASKS).

Worker processes import this module through AGENT_MODULES; nothing registers
these functions as kinds by hand. With TASK_SIGNAL_LOG set, the process
appends every Django task signal it receives to that file, one JSON line each.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

from django.tasks import task
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone


class Unreachable(Exception):
    """A failure of the tests' own making."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def record(path: str, label: str) -> str:
    """Append ``label`` to the file ``path``: the order in which a worker ran the tasks."""
    with open(path, "a") as out:
        out.write(label + "\n")
    return label


@task(queue_name="tasks-other")
def elsewhere() -> str:
    return "ran on tasks-other"


@task(takes_context=True)
def introspect(context, x: int) -> dict:
    return {
        "id": context.task_result.id,
        "attempt": context.attempt,
        "x": x,
        "status": str(context.task_result.status),
        "workers": context.task_result.worker_ids,
    }


@task
async def double_later(x: int) -> int:
    await asyncio.sleep(0.01)  # a coroutine task that awaits: its behaviour, not a wait in a test
    return 2 * x


@task
def refuse(message: str) -> None:
    raise Unreachable(message)


@task
def flaky(marker: str) -> str:
    """Fails with a connection error the first time (retried with backoff), then succeeds."""
    if not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise ConnectionRefusedError("the mail server refused the connection")
    return "sent"


@task
def stall_once(marker: str) -> str:
    """The first execution writes ``marker`` and hangs (the test kills its worker); the next returns."""
    if not os.path.exists(marker):
        Path(marker).write_text(str(os.getpid()))
        time.sleep(120)  # hangs until the test kills its worker: the behaviour under test
    return f"finished by {os.getpid()}"


@task
def unserialisable() -> object:
    return object()


def _log_signal(name):
    def receiver(sender, task_result, **kwargs):
        path = os.environ.get("TASK_SIGNAL_LOG")
        if path:
            with open(path, "a") as out:
                out.write(
                    json.dumps(
                        {
                            "signal": name,
                            "id": task_result.id,
                            "status": str(task_result.status),
                            "sender": sender.__name__,
                            "pid": os.getpid(),
                            "at": timezone.now().isoformat(),
                        }
                    )
                    + "\n"
                )

    return receiver


_receivers = {name: _log_signal(name) for name in ("enqueued", "started", "finished")}
task_enqueued.connect(_receivers["enqueued"], weak=False)
task_started.connect(_receivers["started"], weak=False)
task_finished.connect(_receivers["finished"], weak=False)
