"""A task's run with its history, in one query: the errors its attempts met and the workers that claimed it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import OuterRef

from runs.models import Event, Run, StepAttempt


@dataclass(frozen=True)
class TaskRun:
    run: Run
    errors: list[str]  # each failed or interrupted execution's error, oldest first
    worker_ids: list[str]  # the worker of each claim, in order


def task_run(result_id: str, *, tenant_slug: str | None) -> TaskRun | None:
    """The run ``result_id`` of the backend's tenant (any, with None), or None (also for an id that is not a UUID)."""
    try:
        run_id = uuid.UUID(str(result_id))
    except ValueError:
        return None
    claims = (
        Event.objects.filter(run=OuterRef("pk"), type="run.running")
        .order_by("seq")
        .values("actor_id")
    )
    errors = StepAttempt.objects.filter(run=OuterRef("pk")).order_by("pk").values("error")
    runs = Run.objects.filter(pk=run_id)
    if tenant_slug is not None:
        runs = runs.filter(tenant__slug=tenant_slug)
    run = runs.annotate(
        claim_workers=ArraySubquery(claims), attempt_errors=ArraySubquery(errors)
    ).first()
    if run is None:
        return None
    return TaskRun(run=run, errors=list(run.attempt_errors), worker_ids=list(run.claim_workers))
