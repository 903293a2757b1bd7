"""A ``django.tasks`` backend on this engine: Django's task API with leases, retries and crash recovery.

    TASKS = {"default": {"BACKEND": "runs.tasks.DurableTaskBackend"}}

Any ``@task`` enqueued through Django's public API runs on ``runworker`` as a
one-step run of its own kind (named by the function's dotted path); see
``runs.tasks.backend`` for the options and ``runs.tasks.results`` for how
priorities and statuses map.
"""

from runs.tasks.backend import DurableTaskBackend, autodiscover_tasks, durable_aliases

__all__ = ["DurableTaskBackend", "autodiscover_tasks", "durable_aliases"]
