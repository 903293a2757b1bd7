"""Conversations: create a thread, post to it, close it (the services the API, dashboard and admin share).

A thread's agent sleeps between turns and only a mention wakes it; a
message posted while a turn is live does what the thread's policy (or the
message's) says: ``interleave`` it enters the live turn, ``enqueue`` a new
turn runs after it, ``interrupt`` the live turn is cancelled at its next
step and a new turn follows with every unread message, ``rollback`` the
same after the live turn's compensations, ``reject`` a 409 naming the live
turn. Each service locks the thread's row first (``runs.threads.turns``
says why) and writes its change and its Events in one transaction.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now
from django.utils import timezone

from runs.control.lifecycle import cancel_run
from runs.control.transition import transition
from runs.events import Actor, append_event
from runs.exceptions import IdempotencyConflict, InvalidRunInput, InvalidTransition
from runs.kinds import require_startable
from runs.limits import checked_cents
from runs.models import LIVE_STATUSES, Message, Run, RunStatus, Tenant, Thread
from runs.states import Delivered, ThreadPolicy, ThreadStatus
from runs.text import find_unstorable
from runs.threads.turns import (
    AGENT,
    ThreadBudgetSpent,
    close_locked,
    start_turn,
    turn_input,
)

logger = logging.getLogger(__name__)

__all__ = [
    "AGENT",
    "Posted",
    "ThreadBudgetSpent",
    "ThreadClosed",
    "TurnLive",
    "close_thread",
    "create_thread",
    "post_thread_message",
]

# A message's text, as a run message's (runs.control.post_message) but bounded: a conversation is read
# back by every turn (ctx.history), so one message may not be a document.
MESSAGE_MAX_CHARS = 20_000


class ThreadClosed(InvalidTransition):
    """The thread is closed: it takes no message and starts no turn (409)."""


class TurnLive(InvalidTransition):
    """``reject``: a turn is live, so the message is refused (409); ``run_id`` names that turn."""

    def __init__(self, message: str, *, run_id: Any, turn: int):
        super().__init__(message)
        self.run_id = run_id
        self.turn = turn


@dataclass(frozen=True)
class Posted:
    """What became of a message posted to a thread (the answer of ``POST /api/threads/{id}/messages``)."""

    message: Message
    delivered: Delivered
    run: Run | None  # the turn that reads it (None: recorded for the next turn)


def _checked_text(text: Any, *, where: str = "text") -> str:
    if not isinstance(text, str):
        raise InvalidRunInput(f"{where} must be a string")
    text = text.strip()
    if not text:
        raise InvalidRunInput(f"{where} must not be empty")
    if len(text) > MESSAGE_MAX_CHARS:
        raise InvalidRunInput(f"{where} is {len(text)} characters; at most {MESSAGE_MAX_CHARS}")
    if problem := find_unstorable(text, where=where):
        raise InvalidRunInput(problem)
    return text


def _checked_policy(policy: Any) -> ThreadPolicy:
    if policy not in ThreadPolicy.values:
        raise InvalidRunInput(
            f"unknown policy {policy!r}; one of: {', '.join(ThreadPolicy.values)}"
        )
    return ThreadPolicy(policy)


def _request_hash(**fields: Any) -> str:
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


@transaction.atomic
def create_thread(
    *,
    tenant: Tenant,
    kind: str,
    actor: Actor,
    title: str = "",
    policy: str | None = None,
    state: dict | None = None,
    cost_ceiling_cents: Decimal | float | int | None = None,
    idempotency_key: str | None = None,
    message: str | None = None,
) -> tuple[Thread, Posted | None, bool]:
    """A new thread, asleep; with ``message``, that first message mentions the agent and wakes it.

    Returns the thread, what became of the message, and whether the thread
    was created (False: ``idempotency_key`` found the thread made by the
    same request; a different request with that key is an
    ``IdempotencyConflict``). The kind must be one whose input accepts a
    turn's (``{"thread_id", "turn"}``): it plays every turn.
    """
    if not isinstance(kind, str):
        raise InvalidRunInput("kind must be a string")
    agent_kind = require_startable(tenant, kind)
    if not isinstance(title, str) or len(title) > 200:
        raise InvalidRunInput("title must be a string of at most 200 characters")
    if problem := find_unstorable(title, where="title"):
        raise InvalidRunInput(problem)
    policy = _checked_policy(policy or ThreadPolicy.INTERLEAVE)
    if state is None:
        state = {}
    if not isinstance(state, dict):
        raise InvalidRunInput("state must be a JSON object")
    if problem := find_unstorable(state, where="state"):
        raise InvalidRunInput(problem)
    if cost_ceiling_cents is not None:
        cost_ceiling_cents = checked_cents(cost_ceiling_cents, field="cost_ceiling_cents")
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not 1 <= len(idempotency_key) <= 255
    ):
        raise InvalidRunInput("idempotency_key must be 1 to 255 characters")
    if message is not None:
        message = _checked_text(message, where="message")
    try:
        agent_kind.validate_input(turn_input(Thread(), 1))
    except Exception as exc:  # InvalidAgentInput, or a schema that raises something else
        raise InvalidRunInput(
            f"kind {kind!r} cannot play a thread's turns: its input schema refuses a turn's input "
            f"({{'thread_id', 'turn'}}): {exc}"
        ) from None
    digest = _request_hash(
        kind=kind,
        title=title,
        policy=policy.value,
        state=state,
        cost_ceiling_cents=cost_ceiling_cents,
        message=message,
    )
    if idempotency_key is not None:
        existing = Thread.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            if existing.request_hash != digest:
                raise IdempotencyConflict(
                    f"idempotency key {idempotency_key!r} was already used with a different "
                    f"request (thread {existing.pk})"
                )
            return existing, None, False
    now = timezone.now()
    thread = Thread(
        tenant=tenant,
        kind=kind,
        title=title.strip(),
        policy=policy,
        state=state,
        cost_ceiling_cents=cost_ceiling_cents,
        idempotency_key=idempotency_key,
        request_hash=digest,
        created_at=now,
        updated_at=now,
    )
    try:
        with transaction.atomic():
            thread.save(force_insert=True)
    except IntegrityError:
        # The same key, taken meanwhile by a concurrent create of the same request.
        existing = Thread.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is None:
            raise
        if existing.request_hash != digest:
            raise IdempotencyConflict(
                f"idempotency key {idempotency_key!r} was already used with a different request "
                f"(thread {existing.pk})"
            ) from None
        return existing, None, False
    posted = None
    if message is not None:
        posted = _post_locked(thread, text=message, mention=True, actor=actor, policy=None)
    return thread, posted, True


def _locked(thread: Thread | Any) -> Thread:
    pk = thread.pk if isinstance(thread, Thread) else thread
    return Thread.objects.select_for_update(no_key=True).select_related("tenant").get(pk=pk)


def live_turn(thread: Thread) -> Run | None:
    """The thread's live turn (``thread`` locked); None while it sleeps.

    A thread that says a turn is live when none is (its end was not told,
    which no path should allow) is put to sleep here, with a warning,
    rather than handing a message to a finished run.
    """
    if thread.live_turn is None:
        return None
    run = Run.objects.filter(thread=thread, turn=thread.live_turn).first()
    if run is not None and run.status in LIVE_STATUSES:
        return run
    logger.warning(
        "thread %s names turn %s live, which is not: asleep now", thread.pk, thread.live_turn
    )
    thread.status, thread.live_turn = ThreadStatus.ASLEEP, None
    thread.save(update_fields=["status", "live_turn"])
    return None


@transaction.atomic
def post_thread_message(
    *,
    thread: Thread,
    text: Any,
    actor: Actor,
    mention: bool = True,
    policy: str | None = None,
) -> Posted:
    """Post a person's message to ``thread``; see the module's docstring for what it does.

    A closed thread refuses it (``ThreadClosed``); under ``reject`` a live
    turn refuses it (``TurnLive``); a message that would start a turn is
    refused when the thread's cost ceiling is spent (``ThreadBudgetSpent``)
    or the tenant's queue is full (``QueueFull``). Refused, nothing is
    written.
    """
    text = _checked_text(text)
    if not isinstance(mention, bool):
        raise InvalidRunInput("mention must be true or false")
    chosen = _checked_policy(policy) if policy is not None else None
    return _post_locked(_locked(thread), text=text, mention=mention, actor=actor, policy=chosen)


def _post_locked(
    thread: Thread, *, text: str, mention: bool, actor: Actor, policy: ThreadPolicy | None
) -> Posted:
    if thread.status == ThreadStatus.CLOSED:
        raise ThreadClosed(f"thread {thread.pk} is closed: it takes no more messages")
    live = live_turn(thread) if thread.status == ThreadStatus.ACTIVE else None
    if live is None:
        message = _record(thread, text=text, mention=mention, actor=actor, run=None)
        if not mention:
            return Posted(message, Delivered.RECORDED, None)
        run = start_turn(thread, actor=actor, held=False)  # takes the message just kept
        message.run = run
        return Posted(message, Delivered.NEW_TURN, run)
    policy = policy or ThreadPolicy(thread.policy)
    if policy == ThreadPolicy.REJECT:
        raise TurnLive(
            f"turn {live.turn} of thread {thread.pk} is live (run {live.pk}); "
            "the thread's policy rejects messages until it ends",
            run_id=live.pk,
            turn=live.turn or 0,
        )
    if policy == ThreadPolicy.INTERLEAVE:
        return _interleave(thread, live, text=text, mention=mention, actor=actor)
    # enqueue, interrupt and rollback: a new turn, held until the turns before it end.
    message = _record(thread, text=text, mention=mention, actor=actor, run=None)
    run = start_turn(thread, actor=actor, held=True)
    message.run = run
    if policy == ThreadPolicy.ENQUEUE:
        return Posted(message, Delivered.QUEUED_TURN, run)
    # The live turn is cancelled (at its next step boundary if it is running), with its
    # compensations first under rollback; when it ends, its unread messages join the new turn.
    try:
        cancel_run(run=live, actor=actor, compensate=policy == ThreadPolicy.ROLLBACK)
    except InvalidTransition:
        pass  # it ended meanwhile: the new turn is released by that end
    return Posted(message, Delivered.NEW_TURN, run)


def _interleave(thread: Thread, live: Run, *, text: str, mention: bool, actor: Actor) -> Posted:
    """The message enters the live turn: read at its next message step; a turn waiting for one wakes."""
    live = Run.objects.select_for_update().get(pk=live.pk)
    message = _record(thread, text=text, mention=mention, actor=actor, run=live)
    append_event(
        run_id=live.pk,
        type="message.received",
        actor=actor,
        payload={"message": message.pk, "text": text[:500], "thread": str(thread.pk)},
    )
    if live.status == RunStatus.WAITING and live.children_pending == 0 and live.claimed_at:
        transition(
            live,
            to=RunStatus.QUEUED,
            event="run.queued",
            actor=actor,
            payload={"reason": "message"},
            run_after=Now(),
        )
    return Posted(message, Delivered.LIVE_TURN, live)


def _record(thread: Thread, *, text: str, mention: bool, actor: Actor, run: Run | None) -> Message:
    return Message.objects.create(
        thread=thread,
        run=run,
        author_type=actor.type,
        author_id=actor.id,
        text=text,
        mention=mention,
    )


@transaction.atomic
def close_thread(*, thread: Thread, actor: Actor, summary: str = "") -> Thread:
    """A person closes the thread: no more turns; a live or held turn is cancelled."""
    if not isinstance(summary, str):
        raise InvalidRunInput("summary must be a string")
    if problem := find_unstorable(summary, where="summary"):
        raise InvalidRunInput(problem)
    thread = _locked(thread)
    if thread.status == ThreadStatus.CLOSED:
        raise ThreadClosed(f"thread {thread.pk} is closed already")
    last = Run.objects.filter(thread=thread).order_by("-turn").first()
    thread.updated_at = timezone.now()
    fields = ["status", "live_turn", "summary", "closed_at", "updated_at"]
    if last is None:
        thread.status = ThreadStatus.CLOSED
        thread.summary = summary.strip()[:300]
        thread.closed_at = timezone.now()
        thread.save(update_fields=fields)
        return thread
    close_locked(thread, summary=summary.strip(), run=last, actor=actor, fields=fields)
    thread.refresh_from_db()
    return thread
