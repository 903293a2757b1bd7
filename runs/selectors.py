"""Reads for the API and the dashboard."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from django.db.models import F, Q
from django.http import Http404
from django.utils import timezone

from runs.exceptions import InvalidRunInput
from runs.limits import MAX_INT
from runs.models import Run, RunQuerySet, RunStatus, Step, StepStatus, Tenant
from runs.titles import one_line


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
        raise InvalidRunInput(
            "invalid cursor: pass the next_cursor of a previous page unchanged"
        ) from None


def encode_cursor(run: Run) -> str:
    return _encode([run.created_at.isoformat(), str(run.id)])


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    def parse(position):
        created, run_id = position
        return datetime.fromisoformat(created), UUID(run_id)

    return _decode(cursor, parse)


def list_runs(
    *,
    tenant: Tenant,
    limit: int = 50,
    cursor: str | None = None,
    status: str | None = None,
    kind: str | None = None,
    queue: str | None = None,
    id_search: tuple[UUID, UUID] | None = None,
    without_payloads: bool = False,
    parent: UUID | None = None,
    search: str | None = None,
    schedule: UUID | None = None,
) -> Page:
    """Newest first, keyset-paginated on (created_at, id): page N costs what page 1 costs.

    The API's list and the dashboard's: ``id_search`` is an inclusive id
    range (the dashboard's search by the first characters of an id), and
    ``without_payloads`` leaves the big JSON columns (input, result, error)
    in the table for a list that shows none of them. ``parent`` lists a
    run's children (on the index of children). ``search`` keeps the runs
    whose title or input text contains each of its words, case-insensitively
    and literally (see ``search_terms``, which refuses what no index serves).
    """
    terms = search_terms(search) if search is not None else []
    runs = Run.objects.for_tenant(tenant).newest_first()
    if parent:
        runs = runs.filter(parent_id=parent)
    if schedule:
        runs = runs.filter(schedule_id=schedule)
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
        runs = runs.filter(created_at__lte=created).filter(
            Q(created_at__lt=created) | Q(created_at=created, id__lt=run_id)
        )
    if without_payloads:
        runs = runs.defer("input", "result", "error")
    items = (
        search_runs(runs, terms, tenant=tenant, limit=limit + 1)
        if terms
        else list(runs[: limit + 1])
    )
    next_cursor = encode_cursor(items[limit - 1]) if len(items) > limit else None
    return Page(items=items[:limit], next_cursor=next_cursor)


SEARCH_MAX_CHARS = 200
SEARCH_MAX_WORDS = 8
# Letters or digits, three in a row: what the search index can look up (runs.models.run.SearchKeys).
_INDEXABLE = re.compile(r"[^\W_]{3}")


def search_terms(search: str) -> list[str]:
    """The words of a run search, each matched as a literal substring; [] for a blank search.

    Any text is accepted, hostile or not: NUL and control characters count
    as spaces, ``%``, ``_`` and ``\\`` match themselves. At least one word
    must have three letters or digits in a row, which the search index can
    look up; shorter words then narrow what it found. A search the index
    cannot serve (only short words or punctuation), or longer than
    ``SEARCH_MAX_CHARS`` characters or ``SEARCH_MAX_WORDS`` words, raises
    ``InvalidRunInput`` (a 422) with a sentence saying why.
    """
    if len(search) > SEARCH_MAX_CHARS:
        raise InvalidRunInput(f"search text is at most {SEARCH_MAX_CHARS} characters")
    terms = list(dict.fromkeys(one_line(search, limit=SEARCH_MAX_CHARS).split()))
    if not terms:
        return []
    if len(terms) > SEARCH_MAX_WORDS:
        raise InvalidRunInput(f"search for at most {SEARCH_MAX_WORDS} words at a time")
    if not any(_INDEXABLE.search(term) for term in terms):
        raise InvalidRunInput("search for a word of at least 3 letters or digits")
    return terms


# How many of the newest runs a search reads through before it asks the search index (bench/list_search.py).
SEARCH_WINDOW = 2000


def search_runs(runs: RunQuerySet, terms: list[str], *, tenant: Tenant, limit: int) -> list[Run]:
    """The first ``limit`` of ``runs`` (``tenant``'s, newest first, filtered) that match every one of ``terms``.

    Each statement has one plan it can take, because no single plan is fast
    for every word and PostgreSQL, choosing from statistics of the whole
    table, chose badly: a word common in other tenants but absent from this
    one made it read all of this tenant's runs (2.3 s for 600,000 of them).
    A word common here is found soonest by reading the newest runs until
    ``limit`` match; a rare one through the search index, which has every
    match at once. So: where the newest ``SEARCH_WINDOW`` runs begin (one
    index-only read), then those runs, read in order (a few ms at most);
    then, only if they held too few matches, the older ones, through the
    index's entries of ``tenant`` (never another tenant's) and sorted. Two
    statements, or three. None reads another tenant's runs or index entries,
    so what they cost depends on this tenant's runs only.
    """
    edge = runs.values_list("created_at", flat=True)[SEARCH_WINDOW - 1 : SEARCH_WINDOW].first()
    if edge is None:  # fewer runs than the window: it holds them all
        return list(runs.matching(terms)[:limit])
    # A range PostgreSQL sees the bounds of: it reads these runs through the index of newest runs.
    found = list(runs.filter(created_at__gte=edge).matching(terms)[:limit])
    if len(found) >= limit:
        return found
    # created_at through an expression that no index has, so that PostgreSQL can neither walk
    # the index of newest runs (the slow plan) nor scan one for the range (as costly): it takes
    # the matches from the search index, then sorts them, newest first.
    unindexed = F("created_at") + timedelta(0)
    older = (
        runs.alias(created=unindexed)
        .filter(created__lt=edge)
        .matching(terms, tenant=tenant)
        .order_by(F("created").desc(), "-id")
    )
    return found + list(older[: limit - len(found)])


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
        step = (
            Step.objects.filter(run=run, generation=run.generation, kind="compensation")
            .exclude(status=StepStatus.DONE)
            .order_by("-seq")
            .first()
        )
        return {
            "type": "compensation",
            "step": step.seq if step else None,
            "name": step.name if step else None,
            "input": step.input if step else None,
            "error": run.error,
            "actions": ["retry", "done", "skip", "fail"],
        }
    if run.status == RunStatus.WAITING_HUMAN:
        step = (
            Step.objects.filter(run=run, generation=run.generation, status=StepStatus.WAITING)
            .order_by("-seq")
            .first()
        )
        if step is None:
            # Agent code raised Ambiguous between steps: no step to decide on,
            # but a person can still mark the run done, retry it or fail it.
            return {
                "type": "ambiguous",
                "step": None,
                "name": None,
                "input": None,
                "error": run.error,
                "actions": ["done", "retry", "fail"],
            }
        if step.kind == "approval":
            proposal = (step.input or {}).get("proposal")
            return {"type": "approval", "step": step.seq, "name": step.name, "proposal": proposal}
        return {
            "type": "ambiguous",
            "step": step.seq,
            "name": step.name,
            "input": step.input,
            "error": step.error,
            "actions": ["done", "retry", "fail"],
        }
    if (
        run.status == RunStatus.WAITING
        and run.concurrency_key is not None
        and run.started_at is None
    ):
        return {"type": "concurrency_key", "key": run.concurrency_key}
    if run.status == RunStatus.WAITING:
        # A gather's successes still needed and a timer, only when there are.
        extra: dict[str, str | int] = {"until": run.wake_at.isoformat()} if run.wake_at else {}
        if run.children_pending:
            if run.children_needed is not None:
                extra["needed"] = run.children_needed
            return {"type": "children", "pending": run.children_pending, **extra}
        return {"type": "message", **extra}
    if run.status == RunStatus.PAUSED:
        return {"type": "resume"}
    if run.status == RunStatus.QUEUED and run.run_after and run.run_after > timezone.now():
        sleeping = Step.objects.filter(
            run=run, generation=run.generation, kind="sleep", status=StepStatus.WAITING
        ).exists()
        return {"type": "sleep" if sleeping else "run_after", "until": run.run_after.isoformat()}
    return None
