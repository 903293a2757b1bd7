"""Big backlogs of queued runs, written in one INSERT as submit_run writes each run."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from runs.models import Run, Tenant
from runs.registry import get_kind
from runs.services import request_hash


def backlog_rows(
    tenant: Tenant, n: int, *, priority: int = 5, kind: str = "steps", input: dict | None = None
) -> list[Run]:
    """``n`` queued runs (without their run.queued events), for ``Run.objects.bulk_create``."""
    registered = get_kind(kind)
    data = registered.validate_input({"steps": 1} if input is None else input)
    now = timezone.now()
    return [
        Run(
            tenant=tenant,
            kind=kind,
            queue=registered.queue,
            priority=priority,
            input=data,
            max_attempts=3,
            deadline_seconds=3600,
            request_hash=request_hash(
                kind=kind, input=data, queue=registered.queue, priority=priority
            ),
            # One process's clock per run, as submit_run's: each later than the one before.
            created_at=now + timedelta(microseconds=i),
            updated_at=now,
            expires_at=now + timedelta(days=7),
        )
        for i in range(n)
    ]
