"""How task functions become kinds without anyone registering them.

A ``@task`` on this backend is validated by the backend as the decorator
runs (Django calls ``validate_task``), and the backend registers the kind
then: one kind per task function, named by its dotted path
(``myapp.tasks.send_welcome_email``). For a worker to claim a task it must
have imported the function, so the web process and the worker import the
``tasks`` modules of installed apps whenever a ``TASKS`` backend is this one
(``runs.tasks.backend.autodiscover_tasks``, after the ``agents`` modules and
``AGENT_MODULES``, in ``RunsConfig.ready``). A task defined elsewhere is
found if its module is imported by one of those, or named in
``AGENT_MODULES``.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from django.tasks import Task

_tasks: dict[str, Task] = {}
_lock = threading.Lock()


def remember(task: Task) -> bool:
    """Keep the task under its dotted path; True the first time (the caller registers its kind then)."""
    with _lock:
        if task.module_path in _tasks:
            return False
        _tasks[task.module_path] = task
        return True


def task_for(kind: str) -> Task | None:
    """The task whose kind is ``kind``: one this process defined, else one its dotted path imports; or None."""
    task = _tasks.get(kind)
    if task is not None:
        return task
    from django.tasks import Task

    try:
        found = import_string(kind)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None
