"""The runs Router of the JSON API: thin endpoints over services and selectors."""

from __future__ import annotations

from uuid import UUID

from django.db import connection
from django.http import HttpRequest, HttpResponse
from ninja import Header, Query, Router, Status
from ninja.errors import HttpError
from pydantic import Field

from runs import kinds, selectors, services
from runs.api.auth import ApiAuth, ApiRequest, Authenticated, actor_of, refusal_of
from runs.api.schemas import (
    ErrorOut,
    HealthOut,
    KindOut,
    RunIn,
    RunOut,
    RunPage,
    StepPage,
    StorableIn,
    SubmitHeaders,
)
from runs.exceptions import InvalidRunInput
from runs.models import ApiKey, RunStatus

router = Router(auth=ApiAuth())
ERRORS = {
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    409: ErrorOut,
    413: ErrorOut,
    422: ErrorOut,
    429: ErrorOut,
}


def require_scope(request: Authenticated, scope: str) -> None:
    if not request.auth.has_scope(scope):
        raise HttpError(403, refusal_of(request.auth, scope))


@router.post("/runs", response={200: RunOut, 202: RunOut} | ERRORS, summary="Submit a run")
def submit_run(
    request: ApiRequest,
    response: HttpResponse,
    payload: RunIn,
    headers: Header[SubmitHeaders],
):
    """Validate and queue a run; answers 202 at once (200 when an idempotency key matched)."""
    require_scope(request, ApiKey.Scope.WRITE)
    key = payload.idempotency_key
    if headers.idempotency_key is not None:
        if key is not None and key != headers.idempotency_key:
            raise InvalidRunInput(
                "the Idempotency-Key header and the body's idempotency_key differ"
            )
        key = headers.idempotency_key
    kinds.require_startable(request.auth.tenant, payload.kind)
    submitted = services.submit(
        tenant=request.auth.tenant,
        kind=payload.kind,
        input=payload.input,
        queue=payload.queue,
        priority=payload.priority,
        idempotency_key=key,
        max_attempts=payload.max_attempts,
        cost_ceiling_cents=payload.cost_ceiling_cents,
        deadline_seconds=payload.deadline_seconds,
        expires_in=payload.expires_in,
        concurrency_key=payload.concurrency_key,
        on_conflict=payload.on_conflict,
        callback_url=payload.callback_url or "",
        actor=actor_of(request.auth),
        tenant_is_fresh=True,  # read with the key or the session's membership, just now
    )
    response["Location"] = f"/api/runs/{submitted.run.id}"
    return Status(202 if submitted.created else 200, submitted.run)


class RunFilters(StorableIn):
    status: RunStatus | None = None
    kind: str | None = None
    queue: str | None = None
    parent: UUID | None = Field(default=None, description="only the children of this run")
    schedule: UUID | None = Field(default=None, description="only the runs this schedule made")
    q: str | None = Field(
        default=None,
        description="only runs whose title or input text contains each word (case-insensitive; "
        "at least one word of 3 letters or digits; at most 200 characters)",
    )
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = None


@router.get(
    "/runs", response={200: RunPage} | ERRORS, summary="List the tenant's runs, newest first"
)
def list_runs(request: ApiRequest, filters: Query[RunFilters]):
    require_scope(request, ApiKey.Scope.READ)
    page = selectors.list_runs(
        tenant=request.auth.tenant,
        limit=filters.limit,
        cursor=filters.cursor,
        status=filters.status,
        kind=filters.kind,
        queue=filters.queue,
        parent=filters.parent,
        search=filters.q,
        schedule=filters.schedule,
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get(
    "/runs/{run_id}", response={200: RunOut} | ERRORS, summary="A run's status and progress"
)
def get_run(request: ApiRequest, run_id: UUID):
    run = selectors.get_run(tenant=request.auth.tenant, run_id=run_id)
    require_scope(request, ApiKey.Scope.READ)
    return run


class StepFilters(StorableIn):
    limit: int = Field(default=100, ge=1, le=500)
    cursor: str | None = None


@router.get(
    "/runs/{run_id}/steps",
    response={200: StepPage} | ERRORS,
    summary="A run's audit trail, in pages",
)
def list_steps(request: ApiRequest, run_id: UUID, filters: Query[StepFilters]):
    """Every step of every generation, oldest first: ``?limit=&cursor=`` pages like the run list."""
    run = selectors.get_run(tenant=request.auth.tenant, run_id=run_id)
    require_scope(request, ApiKey.Scope.READ)
    page = selectors.list_steps(run=run, limit=filters.limit, cursor=filters.cursor)
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get(
    "/kinds", response={200: list[KindOut]} | ERRORS, summary="The kinds this tenant may start"
)
def list_kinds(request: ApiRequest):
    """Registered kinds the caller's tenant may start, with their input JSON schema (``runs.kinds``)."""
    require_scope(request, ApiKey.Scope.READ)
    return [
        {
            "name": kind.name,
            "queue": kind.queue,
            "version": kind.version,
            "description": kind.description,
            "input_schema": kind.input_json_schema(),
        }
        for kind in kinds.startable_kinds(request.auth.tenant)
    ]


@router.get(
    "/health",
    auth=None,
    response={200: HealthOut, 503: ErrorOut},
    summary="Liveness of the database",
)
def health(request: HttpRequest):
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:
        return Status(503, {"detail": "the database does not answer"})
    return {"status": "ok"}
