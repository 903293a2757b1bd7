"""Reading conversations: a tenant's threads, a thread's turns and its messages, in keyset pages."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Q
from django.http import Http404

from runs.models import Message, Run, Tenant, Thread
from runs.selectors import _decode, _encode
from runs.threads.turns import AGENT

# At most this many turns are listed with a thread (the newest); the rest page through GET /api/runs.
TURNS_LISTED = 200


def get_thread(*, tenant: Tenant, thread_id: UUID) -> Thread:
    """The tenant's thread; another tenant's thread does not exist (404)."""
    thread = Thread.objects.filter(tenant=tenant, id=thread_id).first()
    if thread is None:
        raise Http404("thread not found")
    return thread


@dataclass(frozen=True)
class ThreadPage:
    items: list[Thread]
    next_cursor: str | None


def list_threads(
    *,
    tenant: Tenant,
    limit: int = 50,
    cursor: str | None = None,
    status: str | None = None,
    kind: str | None = None,
) -> ThreadPage:
    """Newest first, keyset-paginated on (created_at, id), on thread_tenant_recent_idx."""
    threads = Thread.objects.filter(tenant=tenant).order_by("-created_at", "-id")
    if status:
        threads = threads.filter(status=status)
    if kind:
        threads = threads.filter(kind=kind)
    if cursor:

        def parse(position: Any) -> tuple[datetime, UUID]:
            created, thread_id = position
            return datetime.fromisoformat(created), UUID(thread_id)

        created, thread_id = _decode(cursor, parse)
        threads = threads.filter(created_at__lte=created).filter(
            Q(created_at__lt=created) | Q(created_at=created, id__lt=thread_id)
        )
    items = list(threads[: limit + 1])
    next_cursor = (
        _encode([items[limit - 1].created_at.isoformat(), str(items[limit - 1].pk)])
        if len(items) > limit
        else None
    )
    return ThreadPage(items=items[:limit], next_cursor=next_cursor)


def turns_of(thread: Thread) -> list[dict[str, Any]]:
    """The thread's newest turns (at most TURNS_LISTED), oldest first: number, run, status, reply."""
    runs = list(
        Run.objects.filter(thread=thread)
        .order_by("-turn")
        .values("id", "turn", "status", "cost_cents")[:TURNS_LISTED]
    )
    runs.reverse()
    replies: dict[Any, str] = {}
    for run_id, text in (
        Message.objects.filter(run_id__in=[r["id"] for r in runs], author_type=AGENT)
        .order_by("id")
        .values_list("run_id", "text")
    ):
        replies[run_id] = text  # the last reply of each turn
    return [
        {
            "turn": r["turn"],
            "run_id": r["id"],
            "status": r["status"],
            "cost_cents": r["cost_cents"],
            "reply": replies.get(r["id"]),
        }
        for r in runs
    ]


@dataclass(frozen=True)
class MessagePage:
    items: list[dict[str, Any]]
    next_cursor: str | None


def list_messages(*, thread: Thread, limit: int = 100, cursor: str | None = None) -> MessagePage:
    """The conversation oldest first (people's messages and the turns' replies), in keyset pages by id."""
    from runs.threads.replies import as_line

    messages = Message.objects.filter(thread=thread).order_by("id")
    if cursor:
        after = _decode(cursor, lambda position: int(position[0]))
        messages = messages.filter(id__gt=after)
    found = list(messages[: limit + 1])
    page = found[:limit]
    turns = dict(
        Run.objects.filter(pk__in={m.run_id for m in page if m.run_id}).values_list("pk", "turn")
    )
    return MessagePage(
        items=[as_line(m, turns) | {"run_id": m.run_id} for m in page],
        next_cursor=_encode([page[-1].pk]) if len(found) > limit else None,
    )
