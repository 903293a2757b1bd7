"""What a turn writes to and reads from its conversation: its replies, and the history."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import transaction

from runs.events import Actor, append_event
from runs.models import Message, Run
from runs.threads.turns import AGENT


def write_reply(thread_id: UUID, run_id: UUID, *, key: str, author: str, text: str) -> int:
    """Write a turn's reply once (by ``key``: the step's generation and position); its message id.

    A reply step executed again (its worker died before the checkpoint)
    finds the reply it wrote; the message's Event (``thread.reply``, on the
    turn) is written with it, once.
    """
    with transaction.atomic():
        message, created = Message.objects.get_or_create(
            run_id=run_id,
            reply_key=key,
            defaults={
                "thread_id": thread_id,
                "author_type": AGENT,
                "author_id": author[:64],
                "text": text,
            },
        )
        if created:
            append_event(
                run_id=run_id,
                type="thread.reply",
                actor=Actor(type="worker"),
                payload={"thread": str(thread_id), "message": message.pk, "text": text[:2000]},
            )
    return message.pk


def as_line(message: Message, turns: dict[Any, int | None]) -> dict[str, Any]:
    """One line of a conversation, as ``ctx.history()`` and the API show it."""
    return {
        "id": message.pk,
        "role": "assistant" if message.author_type == AGENT else "user",
        "author": f"{message.author_type}:{message.author_id}",
        "text": message.text,
        "mention": message.mention,
        "turn": turns.get(message.run_id) if message.run_id else None,
        "at": message.created_at.isoformat(),
    }


def conversation(thread_id: UUID, *, limit: int) -> list[dict[str, Any]]:
    """The thread's last ``limit`` lines (people's messages and the turns' replies), oldest first."""
    lines = list(Message.objects.filter(thread_id=thread_id).order_by("-id")[:limit])
    lines.reverse()
    run_ids = {m.run_id for m in lines if m.run_id}
    turns = dict(Run.objects.filter(pk__in=run_ids).values_list("pk", "turn"))
    return [as_line(m, turns) for m in lines]
