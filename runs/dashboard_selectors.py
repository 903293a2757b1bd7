"""Reads of the dashboard that the API does not need: id search, the approvals count, the timeline."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from uuid import UUID

from django.db.models import Q

from runs.models import Artifact, Message, Run, RunStatus, Step, Tenant
from runs.selectors import Page, decode_cursor, encode_cursor

ID_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")


def id_range(search: str) -> tuple[UUID, UUID] | None:
    """The UUIDs starting with ``search`` (hex digits, dashes ignored) as an inclusive range; None if not hex.

    A range on the primary key, not ``id::text LIKE``, so the index can answer it.
    """
    digits = search.strip().lower().replace("-", "")
    if not ID_PREFIX.match(digits):
        return None
    return UUID(digits.ljust(32, "0")), UUID(digits.ljust(32, "f"))


def list_runs(
    *, tenant: Tenant, limit: int = 50, cursor: str | None = None,
    status: str | None = None, kind: str | None = None, id_search: tuple[UUID, UUID] | None = None,
) -> Page:
    """Newest first, keyset-paginated on (created_at, id) like ``selectors.list_runs``, plus an id search."""
    runs = Run.objects.for_tenant(tenant).newest_first()
    if status:
        runs = runs.filter(status=status)
    if kind:
        runs = runs.filter(kind=kind)
    if id_search:
        runs = runs.filter(id__gte=id_search[0], id__lte=id_search[1])
    if cursor:
        created, run_id = decode_cursor(cursor)
        # (created_at, id) < (created, run_id), spelled so that the first term bounds
        # the index scan: with the OR alone PostgreSQL filters every newer row (a
        # page in the middle of 100,000 runs took 100 ms instead of 1).
        runs = runs.filter(Q(created_at__lte=created), Q(created_at__lt=created) | Q(id__lt=run_id))
    # The list shows neither inputs nor results: leave the big JSON columns in the table.
    items = list(runs.defer("input", "result", "error")[: limit + 1])
    next_cursor = encode_cursor(items[limit - 1]) if len(items) > limit else None
    return Page(items=items[:limit], next_cursor=next_cursor)


def count_waiting_for_people(*, tenant: Tenant) -> int:
    """Runs waiting for an approver: a pending approval or an ambiguous side effect to resolve."""
    return Run.objects.for_tenant(tenant).filter(status=RunStatus.WAITING_HUMAN).count()


@dataclass
class TimelineStep:
    step: Step
    artifacts: list[Artifact] = field(default_factory=list)


def timeline(*, run: Run) -> list[TimelineStep]:
    """The steps of the run's current generation with their artifacts (two queries)."""
    steps = list(Step.objects.filter(run=run, generation=run.generation).order_by("seq"))
    by_step: dict[int, list[Artifact]] = defaultdict(list)
    if steps:
        for artifact in Artifact.objects.filter(run=run, step__in=[s.pk for s in steps]).order_by("id"):
            by_step[artifact.step_id].append(artifact)
    return [TimelineStep(step=s, artifacts=by_step[s.pk]) for s in steps]


def recent_messages(*, run: Run, limit: int = 20) -> list[Message]:
    """The run's latest messages, oldest first."""
    latest = list(Message.objects.filter(run=run).order_by("-id")[:limit])
    return latest[::-1]


def get_artifact(*, run: Run, artifact_id: int) -> Artifact | None:
    return Artifact.objects.filter(run=run, pk=artifact_id).first()
