"""Event stream endpoints of the runs Router: ``GET /runs/{id}/events`` and its stream token.

The stream accepts three credentials, in this order: an API key in the
``Authorization`` header (with ``runs:read``), a stream token in
``?token=`` (for ``EventSource``), or the dashboard's session (a member of
the run's tenant). An API key in the query string is refused outright,
before anything else: it would be written to access logs and histories.
A token whose key was revoked (or whose user left the tenant) is refused,
and an open stream ends soon after its credential stops holding
(runs.streams.grants, checked by the process's hub).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from asgiref.sync import sync_to_async
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Query, Schema
from ninja.errors import HttpError
from pydantic import Field

from runs import selectors
from runs.api.auth import ApiRequest
from runs.api.endpoints import ERRORS, require_scope, router
from runs.api.schemas import StorableIn
from runs.db import release_connection
from runs.keys import authenticate_key
from runs.limits import MAX_INT
from runs.models import TERMINAL_STATUSES, ApiKey, Membership, Run
from runs.streams import tokens
from runs.streams.grants import Grant, live
from runs.streams.sse import stream_response

# Query parameters an API key could be smuggled in (and the key format itself, below).
KEY_PARAMETERS = ("api_key", "apikey", "key", "access_token", "authorization")
KEY_IN_QUERY = (
    "API keys are never accepted in a query string: send 'Authorization: Bearer <key>', or get a stream "
    "token from POST /api/runs/{id}/stream-token and pass it as ?token="
)


class StreamQuery(StorableIn):
    last_event_id: int | None = Field(
        default=None,
        ge=0,
        le=MAX_INT,
        description="Resume after this Event seq (or send the Last-Event-ID header).",
    )
    token: str | None = Field(
        default=None, max_length=1000, description="A stream token for this run."
    )


class StreamTokenOut(Schema):
    token: str
    expires_at: datetime
    url: str  # the stream's URL with the token, ready for EventSource


@dataclass(frozen=True)
class _Opened:
    last_seq: int
    terminal: bool
    grant: Grant  # what the stream was opened with: it ends when this stops holding


@router.get(
    "/runs/{run_id}/events",
    auth=None,
    response={200: None, 204: None} | ERRORS,
    summary="A run's events as Server-Sent Events (resumable with Last-Event-ID)",
    openapi_extra={
        "responses": {
            "200": {
                "description": "text/event-stream",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        }
    },
)
async def events(request: HttpRequest, run_id: UUID, query: Query[StreamQuery]):
    """Every Event of the run after ``Last-Event-ID``, then new ones as they commit, until a terminal one.

    Each has ``id:`` (its seq), ``event:`` (its type) and JSON ``data:``
    (``run_id``, ``seq``, ``type``, ``at``, ``actor``, ``data``). Updates a
    step pushes with ``ctx.emit`` come without ``id:`` and are not replayed.
    A comment line every 15 s keeps proxies from closing an idle stream.
    204 when the run is finished and the client has seen all its events.
    """
    opened = await sync_to_async(_open, thread_sensitive=False)(request, run_id, query.token)
    after = _last_event_id(request, query)  # after the credentials: 401 and 404 come first
    if opened.terminal and after >= opened.last_seq:
        return HttpResponse(status=204)
    return stream_response(
        run_id=run_id,
        after=after,
        last_seq=opened.last_seq,
        terminal=opened.terminal,
        grant=opened.grant,
    )


@router.post(
    "/runs/{run_id}/stream-token",
    response={200: StreamTokenOut} | ERRORS,
    summary="A token for the run's event stream, valid 60 s (for EventSource)",
)
def stream_token(request: ApiRequest, run_id: UUID):
    run = selectors.get_run(tenant=request.auth.tenant, run_id=run_id)
    require_scope(request, ApiKey.Scope.READ)
    # Issued under the key (or, with the dashboard's session, to the user): the token dies with it.
    if isinstance(request.auth, ApiKey):
        grant = Grant(tenant_id=run.tenant_id, key_id=request.auth.pk)
    else:
        grant = Grant(tenant_id=run.tenant_id, user_id=request.user.pk)
    token, expires_at = tokens.issue(run_id=run.pk, grant=grant)
    return {
        "token": token,
        "expires_at": expires_at,
        "url": f"/api/runs/{run.pk}/events?token={token}",
    }


def _last_event_id(request: HttpRequest, query: StreamQuery) -> int:
    header = request.headers.get("Last-Event-ID")
    if header is None or header.strip() == "":
        return query.last_event_id or 0
    try:
        value = int(header.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_INT:
        raise HttpError(422, "Last-Event-ID must be the seq of an event (a whole number from 0)")
    return value


def _open(request: HttpRequest, run_id: UUID, token: str | None) -> _Opened:
    """Authenticate and find the run: 401, then 404, then 403, like every endpoint. On a thread."""
    try:
        if any(name in request.GET for name in KEY_PARAMETERS) or (token or "").startswith("ak_"):
            raise HttpError(401, KEY_IN_QUERY)
        authorization = request.headers.get("Authorization", "")
        if authorization:
            scheme, _, secret = authorization.partition(" ")
            api_key = authenticate_key(secret.strip()) if scheme.lower() == "bearer" else None
            if api_key is None:
                raise HttpError(
                    401, "a valid API key is required: send 'Authorization: Bearer <key>'"
                )
            run = _find(run_id, tenant_id=api_key.tenant_id)
            require_scope(_AuthOnly(api_key), ApiKey.Scope.READ)
            grant = Grant(tenant_id=api_key.tenant_id, key_id=api_key.pk)
        elif token:
            try:
                grant = tokens.check(token, run_id=run_id)
            except tokens.InvalidToken as exc:
                raise HttpError(401, str(exc)) from None
            if not live([grant]):
                raise HttpError(
                    401,
                    "the API key this stream token was issued under has been revoked"
                    if grant.key_id is not None
                    else "the user this stream token was issued to is no longer a member of the run's tenant",
                )
            run = _find(run_id, tenant_id=grant.tenant_id)
        elif request.user.is_authenticated:
            run = _find(run_id, tenant_id=None)
            # Like the dashboard: a member of the run's tenant, whatever the role (superusers too).
            if not Membership.objects.filter(user=request.user, tenant_id=run.tenant_id).exists():
                raise Http404("run not found")
            grant = Grant(
                tenant_id=run.tenant_id,
                user_id=request.user.pk,
                session_key=request.session.session_key,
            )
        else:
            raise HttpError(
                401, "send 'Authorization: Bearer <key>', a stream token (?token=), or log in"
            )
        return _Opened(
            last_seq=run.last_event_seq, terminal=run.status in TERMINAL_STATUSES, grant=grant
        )
    finally:
        release_connection()


def _find(run_id: UUID, *, tenant_id: UUID | None) -> Run:
    runs = Run.objects.filter(id=run_id)
    if tenant_id is not None:
        runs = runs.filter(tenant_id=tenant_id)
    run = runs.only("id", "tenant_id", "status", "last_event_seq").first()
    if run is None:
        raise Http404("run not found")
    return run


@dataclass(frozen=True)
class _AuthOnly:
    """What ``require_scope`` reads of a request: its authenticated key."""

    auth: ApiKey
