"""Conversation endpoints of the runs Router: threads, their messages and their close (see runs.threads)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from asgiref.sync import sync_to_async
from django.http import Http404, HttpRequest, HttpResponse
from ninja import Query, Schema, Status
from ninja.errors import HttpError
from pydantic import Field, StrictBool

from runs import threads
from runs.api.auth import ApiRequest, actor_of, refusal_of
from runs.api.endpoints import ERRORS, require_scope, router
from runs.api.schemas import CENTS_LIMIT, StorableIn
from runs.api.streams import KEY_IN_QUERY, KEY_PARAMETERS
from runs.db import release_connection
from runs.keys import authenticate_key
from runs.models import ApiKey, Membership, Thread
from runs.states import ThreadPolicy, ThreadStatus
from runs.streams.grants import Grant
from runs.streams.threads import parse_position, thread_stream_response
from runs.threads import selectors
from runs.threads.turns import budget_left


class ThreadIn(StorableIn):
    kind: str = Field(max_length=100, description="the agent kind that plays every turn")
    title: str = Field(default="", max_length=200)
    policy: ThreadPolicy = Field(
        default=ThreadPolicy.INTERLEAVE,
        description="what a message does while a turn is live: interleave, enqueue, interrupt, "
        "rollback or reject",
    )
    state: dict[str, Any] = Field(
        default_factory=dict, description="the agent's canonical state to start from"
    )
    cost_ceiling_cents: float | None = Field(
        default=None,
        ge=0,
        lt=CENTS_LIMIT,
        allow_inf_nan=False,
        description="what all its turns together may spend",
    )
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)
    message: str | None = Field(
        default=None,
        min_length=1,
        max_length=threads.MESSAGE_MAX_CHARS,
        description="a first message, which mentions the agent: it starts turn 1",
    )


class ThreadMessageIn(StorableIn):
    text: str = Field(min_length=1, max_length=threads.MESSAGE_MAX_CHARS)
    mention: StrictBool = Field(
        default=True, description="it calls the agent: a sleeping thread wakes for it"
    )
    policy: ThreadPolicy | None = Field(
        default=None, description="this message's policy instead of the thread's"
    )


class CloseIn(StorableIn):
    summary: str = Field(default="", max_length=300)


class TurnOut(Schema):
    turn: int
    run_id: UUID
    status: str
    cost_cents: float
    reply: str | None = Field(description="the turn's last reply (ctx.reply), if it said one")


class ThreadOut(Schema):
    id: UUID
    kind: str
    title: str
    status: ThreadStatus
    policy: ThreadPolicy
    state: dict[str, Any]
    cost_cents: float
    cost_ceiling_cents: float | None
    budget_left_cents: float | None
    turns_total: int = Field(description="how many turns it has had")
    live_turn: int | None = Field(description="the turn that is live; null while it sleeps")
    summary: str
    created_at: datetime
    updated_at: datetime
    closed_at: datetime | None

    @staticmethod
    def resolve_turns_total(thread: Thread) -> int:
        return thread.turns

    @staticmethod
    def resolve_budget_left_cents(thread: Thread) -> Decimal | None:
        return budget_left(thread)


class ThreadDetailOut(ThreadOut):
    turns: list[TurnOut] = Field(description="its newest turns (at most 200), oldest first")

    @staticmethod
    def resolve_turns(thread: Thread) -> list[dict[str, Any]]:
        return selectors.turns_of(thread)


class PostedOut(Schema):
    message_id: int
    delivered: str = Field(description="live_turn, new_turn, queued_turn or recorded")
    run_id: UUID | None = Field(description="the turn that reads it; null when recorded only")
    turn: int | None


class CreatedOut(ThreadDetailOut):
    message: PostedOut | None = None


class ThreadPage(Schema):
    items: list[ThreadOut]
    next_cursor: str | None


class LineOut(Schema):
    id: int
    role: str = Field(description="user (a person) or assistant (a turn's reply)")
    author: str
    text: str
    mention: bool
    turn: int | None = Field(description="the turn that read it, or said it; null: not read yet")
    run_id: UUID | None
    at: datetime


class LinePage(Schema):
    items: list[LineOut]
    next_cursor: str | None


class ThreadFilters(StorableIn):
    status: ThreadStatus | None = None
    kind: str | None = Field(default=None, max_length=100)
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = Field(default=None, max_length=500)


class LineFilters(StorableIn):
    limit: int = Field(default=100, ge=1, le=500)
    cursor: str | None = Field(default=None, max_length=500)


def _posted(posted: threads.Posted | None) -> dict[str, Any] | None:
    if posted is None:
        return None
    return {
        "message_id": posted.message.pk,
        "delivered": posted.delivered.value,
        "run_id": posted.run.pk if posted.run is not None else None,
        "turn": posted.run.turn if posted.run is not None else None,
    }


@router.post(
    "/threads",
    response={200: CreatedOut, 201: CreatedOut} | ERRORS,
    summary="Start a conversation",
)
def create_thread(request: ApiRequest, response: HttpResponse, payload: ThreadIn):
    """A new thread, asleep; with ``message``, its first turn starts (201; 200 when an idempotency key matched)."""
    require_scope(request, ApiKey.Scope.WRITE)
    thread, posted, created = threads.create_thread(
        tenant=request.auth.tenant,
        kind=payload.kind,
        actor=actor_of(request.auth),
        title=payload.title,
        policy=payload.policy,
        state=payload.state,
        cost_ceiling_cents=payload.cost_ceiling_cents,
        idempotency_key=payload.idempotency_key,
        message=payload.message,
    )
    response["Location"] = f"/api/threads/{thread.pk}"
    thread.refresh_from_db()
    thread.message = _posted(posted)  # type: ignore[attr-defined]  # read by CreatedOut
    return Status(201 if created else 200, thread)


@router.get(
    "/threads",
    response={200: ThreadPage} | ERRORS,
    summary="List the tenant's threads, newest first",
)
def list_threads(request: ApiRequest, filters: Query[ThreadFilters]):
    require_scope(request, ApiKey.Scope.READ)
    page = selectors.list_threads(
        tenant=request.auth.tenant,
        limit=filters.limit,
        cursor=filters.cursor,
        status=filters.status,
        kind=filters.kind,
    )
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.get(
    "/threads/{thread_id}",
    response={200: ThreadDetailOut} | ERRORS,
    summary="A thread: status, policy, state, cost and turns",
)
def get_thread(request: ApiRequest, thread_id: UUID):
    thread = selectors.get_thread(tenant=request.auth.tenant, thread_id=thread_id)
    require_scope(request, ApiKey.Scope.READ)
    return thread


@router.get(
    "/threads/{thread_id}/messages",
    response={200: LinePage} | ERRORS,
    summary="A thread's conversation, oldest first, in pages",
)
def list_messages(request: ApiRequest, thread_id: UUID, filters: Query[LineFilters]):
    thread = selectors.get_thread(tenant=request.auth.tenant, thread_id=thread_id)
    require_scope(request, ApiKey.Scope.READ)
    page = selectors.list_messages(thread=thread, limit=filters.limit, cursor=filters.cursor)
    return {"items": page.items, "next_cursor": page.next_cursor}


@router.post(
    "/threads/{thread_id}/messages",
    response={202: PostedOut} | ERRORS,
    summary="Post a message to a thread",
)
def post_message(request: ApiRequest, thread_id: UUID, payload: ThreadMessageIn):
    """What it did is in ``delivered``; under ``reject`` a live turn answers 409 with its ``run_id``."""
    thread = selectors.get_thread(tenant=request.auth.tenant, thread_id=thread_id)
    require_scope(request, ApiKey.Scope.WRITE)
    posted = threads.post_thread_message(
        thread=thread,
        text=payload.text,
        actor=actor_of(request.auth),
        mention=payload.mention,
        policy=payload.policy,
    )
    return Status(202, _posted(posted))


@router.post(
    "/threads/{thread_id}/close",
    response={200: ThreadDetailOut} | ERRORS,
    summary="Close a thread (a live turn is cancelled)",
)
def close(request: ApiRequest, thread_id: UUID, payload: CloseIn | None = None):
    thread = selectors.get_thread(tenant=request.auth.tenant, thread_id=thread_id)
    require_scope(request, ApiKey.Scope.WRITE)
    payload = payload or CloseIn()
    return threads.close_thread(
        thread=thread, actor=actor_of(request.auth), summary=payload.summary
    )


@router.get(
    "/threads/{thread_id}/events",
    auth=None,
    response={200: None} | ERRORS,
    summary="A thread's events across its turns, as Server-Sent Events (resumable)",
    openapi_extra={
        "responses": {
            "200": {
                "description": "text/event-stream",
                "content": {"text/event-stream": {"schema": {"type": "string"}}},
            }
        }
    },
)
async def events(request: HttpRequest, thread_id: UUID):
    """Every Event of every turn, in order, then new ones as they commit, until ``thread.closed``.

    Each Event's ``id:`` is ``<turn>.<seq>``: send the last one as
    ``Last-Event-ID`` (or ``?last_event_id=``) to resume after it. The
    credentials are those of a run's stream: an API key in the
    ``Authorization`` header (``runs:read``) or the dashboard's session.
    """
    grant = await sync_to_async(_open_stream, thread_sensitive=False)(request, thread_id)
    value = request.headers.get("Last-Event-ID") or request.GET.get("last_event_id")
    position = parse_position(value)
    if position is None:
        raise HttpError(
            422, "Last-Event-ID must be the id of an event of this stream: <turn>.<seq>"
        )
    return thread_stream_response(thread_id=thread_id, position=position, grant=grant)


def _open_stream(request: HttpRequest, thread_id: UUID) -> Grant:
    """401, then 404, then 403, as for a run's stream; the grant the stream is held to."""
    try:
        if any(name in request.GET for name in KEY_PARAMETERS):
            raise HttpError(401, KEY_IN_QUERY)
        authorization = request.headers.get("Authorization", "")
        if authorization:
            scheme, _, secret = authorization.partition(" ")
            api_key = authenticate_key(secret.strip()) if scheme.lower() == "bearer" else None
            if api_key is None:
                raise HttpError(
                    401, "a valid API key is required: send 'Authorization: Bearer <key>'"
                )
            if not Thread.objects.filter(pk=thread_id, tenant_id=api_key.tenant_id).exists():
                raise Http404("thread not found")
            if not api_key.has_scope(ApiKey.Scope.READ):
                raise HttpError(403, refusal_of(api_key, ApiKey.Scope.READ))
            return Grant(tenant_id=api_key.tenant_id, key_id=api_key.pk)
        if request.user.is_authenticated:
            tenant_id = (
                Thread.objects.filter(pk=thread_id).values_list("tenant_id", flat=True).first()
            )
            if (
                tenant_id is None
                or not Membership.objects.filter(user=request.user, tenant_id=tenant_id).exists()
            ):
                raise Http404("thread not found")
            return Grant(
                tenant_id=tenant_id,
                user_id=request.user.pk,
                session_key=request.session.session_key,
            )
        raise HttpError(401, "send 'Authorization: Bearer <key>', or log in")
    finally:
        release_connection()
