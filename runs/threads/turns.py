"""The turns of a conversation: which one may run, and what a turn leaves behind when it ends.

A thread's turns are runs numbered 1, 2, ... ``Thread.live_turn`` names the
one that is live (queued, running, waiting, paused...): the only one that
may be claimed. A turn made while another is live is *held*: it waits
(status ``waiting``, never claimed) until every turn before it has ended,
and ``turn_ended`` then queues it, in number order. A turn becomes
claimable only here, under its thread's lock, and only when no earlier turn
is live: so at most one turn of a thread runs at any time, whatever the
interleaving of messages, claims, reaps and cancels.

Lock order: a thread's row, then its turns' rows. Every change of a turn's
status takes its thread's lock first (``lock_thread_of``): a message posted
to the thread (``runs.threads``), a person's action on the turn
(``runs.control.transition.locked``), the exit from running
(``runs.engine.exit``) and the reaper's expiry (``runs.engine.reaping``).

When a turn ends (``turn_ended``, in the transaction that made it
terminal): what it spent joins the thread's cost; if it ended well, the
state patches it recorded (``ctx.update_state``) are merged into the
thread's state, and a ``ctx.close_thread`` closes the thread; a turn that
failed or was cancelled leaves the state as it found it. The messages it
did not read go to the next turn, or are kept for the next one. Then the
next held turn is queued, or the thread falls asleep.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Sum
from django.db.models.functions import Now
from django.utils import timezone

from runs import payloads
from runs.engine.turns import on_turn_ended
from runs.events import SYSTEM, Actor, append_event
from runs.exceptions import InvalidRunInput, InvalidTransition, QueueFull, UnknownKind
from runs.models import LIVE_STATUSES, Message, Run, RunStatus, Step, Thread
from runs.registry import get_kind
from runs.states import ErrorKind, StepKind, StepStatus, ThreadStatus

logger = logging.getLogger(__name__)

# The author_type of a turn's reply (ctx.reply): a line of the conversation that no step reads as a message.
AGENT = "agent"


class ThreadBudgetSpent(InvalidTransition):
    """The thread's cost ceiling is spent: no new turn may start."""


def budget_left(thread: Thread) -> Decimal | None:
    """What the thread may still spend under its ceiling, over all its turns (None: no ceiling)."""
    if thread.cost_ceiling_cents is None:
        return None
    return max(thread.cost_ceiling_cents - thread.cost_cents, Decimal(0))


def turn_ceiling(thread: Thread) -> Decimal | None:
    """A new turn's cost ceiling: its kind's (or the tenant's default), cut to what the thread has left."""
    kind = get_kind(thread.kind)
    base: Any = kind.cost_ceiling_cents if kind is not None else None
    if base is None:
        base = thread.tenant.default_cost_ceiling_cents
    left = budget_left(thread)
    if left is None:
        return None if base is None else Decimal(str(base))
    return left if base is None else min(Decimal(str(base)), left)


def check_budget(thread: Thread) -> None:
    left = budget_left(thread)
    if left is not None and left <= 0:
        raise ThreadBudgetSpent(
            f"the thread's cost ceiling of {thread.cost_ceiling_cents} cents is spent "
            f"({thread.cost_cents} cents over {thread.turns} turns): no new turn can start"
        )


def turn_input(thread: Thread, number: int) -> dict[str, Any]:
    """The input a turn's run is submitted with (the turn reads its conversation through ctx)."""
    return {"thread_id": str(thread.pk), "turn": number}


def start_turn(thread: Thread, *, actor: Actor, held: bool) -> Run:
    """A new turn of ``thread`` (locked by the caller): queued, or held behind the live turn.

    It takes the thread's messages kept for the next turn. Refused
    (``ThreadBudgetSpent``) when the thread's cost ceiling is spent; the
    submit's own checks apply (backpressure: ``QueueFull``).
    """
    from runs.services import submit  # services import the engine; this module is imported by it

    check_budget(thread)
    number = thread.turns + 1
    run = submit(
        tenant=thread.tenant,
        kind=thread.kind,
        input=turn_input(thread, number),
        cost_ceiling_cents=turn_ceiling(thread),
        actor=actor,
        thread=thread,
        turn=number,
        held_after=thread.live_turn if held else None,
    ).run
    Message.objects.filter(thread=thread, run__isnull=True).update(run=run)
    thread.turns = number
    if not held:
        thread.live_turn = number
        thread.status = ThreadStatus.ACTIVE
    thread.updated_at = timezone.now()
    thread.save(update_fields=["turns", "live_turn", "status", "updated_at"])
    return run


def spent(thread: Thread) -> Decimal:
    """What the thread's turns have spent, their children included (a retried turn counts once)."""
    total = Run.objects.filter(thread=thread).aggregate(
        total=Sum(F("cost_cents") + F("children_cost_cents"))
    )["total"]
    return total or Decimal(0)


def retry_turn(run: Run) -> None:
    """Make ``run``, a turn that failed or was cancelled, the live turn again (``runs.control.retry_run``).

    Only the thread's last turn, and only while the thread sleeps: a turn
    retried while another is live, or after later turns ran, would break
    the order of the conversation (``InvalidTransition``).
    """
    if run.thread_id is None:
        raise ValueError(f"run {run.pk} is not a turn")
    thread = Thread.objects.select_for_update(no_key=True).get(pk=run.thread_id)
    if thread.status == ThreadStatus.CLOSED:
        raise InvalidTransition(f"thread {thread.pk} is closed: its turns cannot be retried")
    if thread.live_turn is not None:
        raise InvalidTransition(
            f"turn {thread.live_turn} of thread {thread.pk} is live: a turn is retried only "
            "while its thread sleeps"
        )
    if Run.objects.filter(thread=thread, turn__gt=run.turn).exists():
        raise InvalidTransition(
            f"only the last turn of thread {thread.pk} can be retried: later turns have run since"
        )
    check_budget(thread)
    thread.live_turn = run.turn
    thread.status = ThreadStatus.ACTIVE
    thread.updated_at = timezone.now()
    thread.save(update_fields=["live_turn", "status", "updated_at"])


def state_changes(run: Run) -> tuple[dict[str, Any], str | None]:
    """The state patches a turn recorded, merged in order, and its close_thread summary (None if it did not close)."""
    patch: dict[str, Any] = {}
    closing: str | None = None
    recorded = Step.objects.filter(
        run=run, generation=run.generation, kind=StepKind.STATE, status=StepStatus.DONE
    ).order_by("seq")
    for output in recorded.values_list("output", flat=True):
        output = payloads.resolve_json(output, run_id=run.pk)
        if not isinstance(output, dict):
            continue
        if isinstance(output.get("patch"), dict):
            patch |= output["patch"]
        if "close" in output:
            closing = str(output["close"] or "")
    return patch, closing


def last_reply(run: Run) -> str | None:
    text = (
        Message.objects.filter(run=run, author_type=AGENT)
        .order_by("-id")
        .values_list("text", flat=True)
        .first()
    )
    return text


@on_turn_ended
def turn_ended(run_id: Any, *, actor: Actor = SYSTEM) -> None:
    """What a turn that just became terminal leaves to its thread; see the module's docstring.

    Called in the transaction that made it terminal, with the thread locked
    first (``lock_thread_of``).
    """
    run = Run.objects.get(pk=run_id)
    if run.thread_id is None or run.status not in (
        RunStatus.DONE,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    ):
        raise ValueError(f"run {run_id} is not a turn that ended")
    thread = (
        Thread.objects.select_for_update(no_key=True).select_related("tenant").get(pk=run.thread_id)
    )
    assert run.turn is not None  # a run with a thread has a turn (run_turn_iff_thread)
    thread.cost_cents = spent(thread)
    closing: str | None = None
    if run.status == RunStatus.DONE and thread.status != ThreadStatus.CLOSED:
        patch, closing = state_changes(run)
        if patch:
            thread.state = {**(thread.state or {}), **patch}
    later = (
        Run.objects.filter(thread=thread, turn__gt=run.turn, status__in=LIVE_STATUSES)
        .order_by("turn")
        .first()
    )
    # The messages it did not read belong to the next turn, or are kept for the next one.
    unread = Message.objects.filter(run=run, consumed_by_step__isnull=True).exclude(
        author_type=AGENT
    )
    woken_by_unread = unread.filter(mention=True).exists()
    unread.update(run=later)
    was_live = thread.live_turn == run.turn
    thread.updated_at = timezone.now()
    fields = ["cost_cents", "state", "updated_at", "status", "live_turn", "summary", "closed_at"]
    if closing is not None:
        close_locked(thread, summary=closing, run=run, actor=actor, fields=fields)
        return
    if not was_live:
        thread.save(update_fields=fields)
        return
    if later is not None:
        thread.live_turn = later.turn
        thread.save(update_fields=fields)
        _release(thread, later, after=run, actor=actor)
        return
    if (
        run.status == RunStatus.DONE
        and woken_by_unread
        and thread.status == ThreadStatus.ACTIVE
        and budget_left(thread) != Decimal(0)
    ):
        # A mention that arrived after the turn's last read: it wakes the thread again at once,
        # unless no turn may start now (the tenant's queue is full): then it waits for the next one.
        thread.save(update_fields=fields)
        try:
            with transaction.atomic():
                start_turn(thread, actor=SYSTEM, held=False)
            return
        except (QueueFull, ThreadBudgetSpent, UnknownKind, InvalidRunInput) as exc:
            logger.warning("thread %s could not wake for a late mention: %s", thread.pk, exc)
            thread.refresh_from_db()
    if thread.status == ThreadStatus.ACTIVE:
        thread.status = ThreadStatus.ASLEEP
    thread.live_turn = None
    thread.save(update_fields=fields)
    if thread.status == ThreadStatus.ASLEEP:
        append_event(
            run_id=run.pk,
            type="thread.asleep",
            actor=actor,
            payload={
                "thread": str(thread.pk),
                "turn": run.turn,
                "status": run.status,
                "reply": last_reply(run),
                "cost_cents": str(thread.cost_cents),
            },
        )


def _release(thread: Thread, run: Run, *, after: Run, actor: Actor) -> None:
    """Queue held turn ``run``, now the live one, with what the thread has left (or fail it: nothing left)."""
    from runs.control.transition import transition  # control imports this module

    run = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
    if run.status != RunStatus.WAITING or run.claimed_at is not None:
        return  # live already (it was never held)
    left = budget_left(thread)
    if left is not None and left <= 0:
        transition(
            run,
            to=RunStatus.FAILED,
            event="run.failed",
            actor=actor,
            payload={"reason": "budget", "error_kind": ErrorKind.BUDGET},
            error_kind=ErrorKind.BUDGET,
            error="the thread's cost ceiling was spent before this turn could start",
        )
        return
    transition(
        run,
        to=RunStatus.QUEUED,
        event="run.queued",
        actor=actor,
        payload={"reason": "turn", "after_turn": after.turn},
        run_after=Now(),
        cost_ceiling_cents=turn_ceiling(thread),
    )


def close_locked(
    thread: Thread, *, summary: str, run: Run, actor: Actor, fields: list[str]
) -> None:
    """Close the thread, its row locked (its turn said so, or a person did); the turns held after it are cancelled."""
    from runs.control.lifecycle import cancel_run  # control imports this module

    thread.status = ThreadStatus.CLOSED
    thread.live_turn = None
    thread.summary = summary[:300]
    thread.closed_at = timezone.now()
    thread.save(update_fields=fields)
    append_event(
        run_id=run.pk,
        type="thread.closed",
        actor=actor,
        payload={"thread": str(thread.pk), "turn": run.turn, "summary": thread.summary},
    )
    for held in Run.objects.filter(thread=thread, status__in=LIVE_STATUSES).order_by("turn"):
        cancel_run(run=held, actor=actor)
