"""Reads for the API and the dashboard."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db.models import Q
from django.http import Http404
from django.utils import timezone

from runs.exceptions import InvalidRunInput
from runs.limits import MAX_INT
from runs.models import Run, RunStatus, Step, StepStatus, Tenant


def get_run(*, tenant: Tenant, run_id: UUID) -> Run:
    """The tenant's run; another tenant's run does not exist (404)."""
    run = Run.objects.filter(tenant=tenant, id=run_id).first()
    if run is None:
        raise Http404("run not found")
    return run


@dataclass(frozen=True)
class Page:
    items: list[Run]
    next_cursor: str | None


def _encode(value: list) -> str:
    """A keyset page's position as an opaque cursor."""
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def _decode(cursor: str, parse):
    """``parse`` of the position a cursor holds; any damage is a 422."""
    try:
        return parse(json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))))
    except Exception:
        raise InvalidRunInput("invalid cursor: pass the next_cursor of a previous page unchanged") from None


def encode_cursor(run: Run) -> str:
    return _encode([run.created_at.isoformat(), str(run.id)])


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    def parse(position):
        created, run_id = position
        return datetime.fromisoformat(created), UUID(run_id)

    return _decode(cursor, parse)


def list_runs(
    *, tenant: Tenant, limit: int = 50, cursor: str | None = None,
    status: str | None = None, kind: str | None = None, queue: str | None = None,
    id_search: tuple[UUID, UUID] | None = None, without_payloads: bool = False, parent: UUID | None = None,
) -> Page:
    """Newest first, keyset-paginated on (created_at, id): page N costs what page 1 costs.

    The API's list and the dashboard's: ``id_search`` is an inclusive id
    range (the dashboard's search by the first characters of an id), and
    ``without_payloads`` leaves the big JSON columns (input, result, error)
    in the table for a list that shows none of them. ``parent`` lists a
    run's children (on the index of children).
    """
    runs = Run.objects.for_tenant(tenant).newest_first()
    if parent:
        runs = runs.filter(parent_id=parent)
    if status:
        runs = runs.filter(status=status)
    if kind:
        runs = runs.filter(kind=kind)
    if queue:
        runs = runs.filter(queue=queue)
    if id_search:
        runs = runs.filter(id__gte=id_search[0], id__lte=id_search[1])
    if cursor:
        created, run_id = decode_cursor(cursor)
        # created_at <= c bounds the index scan; the OR alone makes PostgreSQL
        # read every newer row first (a page in the middle of 100,000 runs
        # took 100 ms instead of 1).
        runs = runs.filter(created_at__lte=created).filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=run_id))
    if without_payloads:
        runs = runs.defer("input", "result", "error")
    items = list(runs[: limit + 1])
    next_cursor = encode_cursor(items[limit - 1]) if len(items) > limit else None
    return Page(items=items[:limit], next_cursor=next_cursor)


@dataclass(frozen=True)
class StepPage:
    items: list[Step]
    next_cursor: str | None


def list_steps(*, run: Run, limit: int = 100, cursor: str | None = None) -> StepPage:
    """The run's audit trail, every generation, oldest first, in keyset pages on (generation, seq)."""
    steps = Step.objects.filter(run=run).order_by("generation", "seq")
    if cursor:
        generation, seq = _decode_step_cursor(cursor)
        steps = steps.filter(generation__gte=generation).filter(
            Q(generation__gt=generation) | Q(generation=generation, seq__gt=seq)
        )
    items = list(steps[: limit + 1])
    next_cursor = None
    if len(items) > limit:
        last = items[limit - 1]
        next_cursor = _encode([last.generation, last.seq])
    return StepPage(items=items[:limit], next_cursor=next_cursor)


def _decode_step_cursor(cursor: str) -> tuple[int, int]:
    def parse(position):
        generation, seq = position
        if not all(isinstance(n, int) and 0 <= n <= MAX_INT for n in (generation, seq)):
            raise ValueError(position)
        return generation, seq

    return _decode(cursor, parse)


def waiting_for(run: Run) -> dict | None:
    """What a run waits for, for people and integrations; queries only for runs that wait."""
    if run.status == RunStatus.WAITING_HUMAN and run.compensation == "running":
        step = (Step.objects.filter(run=run, generation=run.generation, kind="compensation")
                .exclude(status=StepStatus.DONE).order_by("-seq").first())
        return {"type": "compensation", "step": step.seq if step else None, "name": step.name if step else None,
                "input": step.input if step else None, "error": run.error,
                "actions": ["retry", "done", "skip", "fail"]}
    if run.status == RunStatus.WAITING_HUMAN:
        step = (
            Step.objects.filter(run=run, generation=run.generation, status=StepStatus.WAITING).order_by("-seq").first()
        )
        if step is None:
            # Agent code raised Ambiguous between steps: no step to decide on,
            # but a person can still mark the run done, retry it or fail it.
            return {"type": "ambiguous", "step": None, "name": None, "input": None, "error": run.error,
                    "actions": ["done", "retry", "fail"]}
        if step.kind == "approval":
            proposal = (step.input or {}).get("proposal")
            return {"type": "approval", "step": step.seq, "name": step.name, "proposal": proposal}
        return {"type": "ambiguous", "step": step.seq, "name": step.name, "input": step.input, "error": step.error,
                "actions": ["done", "retry", "fail"]}
    if run.status == RunStatus.WAITING:
        # A gather's successes still needed and a timer, only when there are.
        extra = {"until": run.wake_at.isoformat()} if run.wake_at else {}
        if run.children_pending:
            if run.children_needed is not None:
                extra["needed"] = run.children_needed
            return {"type": "children", "pending": run.children_pending, **extra}
        return {"type": "message", **extra}
    if run.status == RunStatus.PAUSED:
        return {"type": "resume"}
    if run.status == RunStatus.QUEUED and run.run_after and run.run_after > timezone.now():
        sleeping = Step.objects.filter(run=run, generation=run.generation, kind="sleep",
                                       status=StepStatus.WAITING).exists()
        return {"type": "sleep" if sleeping else "run_after", "until": run.run_after.isoformat()}
    return None
