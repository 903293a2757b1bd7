"""A run's life by people's hands: cancel, pause, resume, and the messages that wake a waiting run."""

from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Now

from runs.control.transition import Outcome, expires_from_now, locked, refuse, request, transition
from runs.db import notify_control
from runs.engine import family
from runs.events import SYSTEM, Actor, append_event
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.models import TERMINAL_STATUSES, Compensation, Message, Run, RunStatus, Step, StepStatus
from runs.text import find_unstorable


@transaction.atomic
def cancel_run(*, run: Run, actor: Actor, compensate: bool = False) -> Outcome:
    """Cancel at once, or (running) at the run's next step boundary.

    With ``compensate`` the run first rolls back its finished steps that
    have a compensation (a saga), on a worker, and then ends ``cancelled``;
    a run with no finished step is cancelled at once.
    """
    run = locked(run)
    if run.status in TERMINAL_STATUSES:
        raise refuse(run, "cancel")
    if compensate and run.compensation == Compensation.REQUESTED:
        return Outcome(run, later=True)  # asked already: a worker is to roll it back
    rolls_back = compensate and run.compensation == "" and _has_finished_steps(run)
    if run.status == RunStatus.RUNNING:
        if rolls_back:
            Run.objects.filter(pk=run.pk).update(compensation=Compensation.REQUESTED)
        return Outcome(
            request(
                run,
                field="cancel_requested_at",
                event="run.cancel_requested",
                actor=actor,
                payload={"compensate": True} if rolls_back else None,
            ),
            later=True,
        )
    if rolls_back:
        # A worker replays the run to learn its compensations, runs them, and cancels it.
        return Outcome(
            transition(
                run,
                to=RunStatus.QUEUED,
                event="run.cancel_requested",
                actor=actor,
                payload={"compensate": True},
                cancel_requested_at=Now(),
                run_after=Now(),
                compensation=Compensation.REQUESTED,
            ),
            later=True,
        )
    # A run parked in the middle of its rollback stops there: not everything was undone. A
    # plain cancel of one queued for a rollback that has not begun withdraws the rollback.
    stopped: dict[str, str] = {
        Compensation.RUNNING: Compensation.PARTIAL,
        Compensation.REQUESTED: Compensation.NONE,
    }
    cancelled = transition(
        run,
        to=RunStatus.CANCELLED,
        event="run.cancelled",
        actor=actor,
        cancel_requested_at=Now(),
        compensation=stopped.get(run.compensation, run.compensation),
    )
    cancel_children_after_commit(cancelled)
    return Outcome(cancelled)


def cancel_children_after_commit(run: Run) -> None:
    """A run that failed or was cancelled by a person cancels its live children once that commits."""
    run_id = run.pk
    transaction.on_commit(lambda: cancel_children(run_id))


def cancel_runs(run_ids, *, actor: Actor = SYSTEM) -> int:
    """Cancel each of these runs that is still live, each in its own transaction; returns how many."""
    cancelled = 0
    for run_id in run_ids:
        try:
            with transaction.atomic():
                cancel_run(run=Run(pk=run_id), actor=actor)
            cancelled += 1
        except (Run.DoesNotExist, InvalidTransition):
            pass  # finished meanwhile
    return cancelled


def cancel_children(run_id) -> int:
    """Cancel the live children of a run that failed or was cancelled (a running one at its next step)."""
    return cancel_runs(
        family.live_children(run_id), actor=Actor(type="system", id=f"parent:{run_id}")
    )


def _has_finished_steps(run: Run) -> bool:
    return Step.objects.filter(run=run, generation=run.generation, status=StepStatus.DONE).exists()


@transaction.atomic
def pause_run(*, run: Run, actor: Actor) -> Outcome:
    """Pause a queued run at once, or a running one at its next step boundary (it releases its worker)."""
    run = locked(run)
    if run.status == RunStatus.RUNNING:
        return Outcome(
            request(run, field="pause_requested_at", event="run.pause_requested", actor=actor),
            later=True,
        )
    if run.status != RunStatus.QUEUED:
        raise refuse(run, "pause")
    return Outcome(
        transition(
            run,
            to=RunStatus.PAUSED,
            event="run.paused",
            actor=actor,
            pause_requested_at=Now(),
            expires_at=expires_from_now(),
        )
    )


@transaction.atomic
def resume_run(*, run: Run, actor: Actor) -> Outcome:
    """Queue a paused run again (it continues from its step log); withdraw a pause not yet honoured."""
    run = locked(run)
    if run.status == RunStatus.RUNNING and run.pause_requested_at is not None:
        # Withdraw a pause the worker has not honoured yet; its heartbeat
        # (woken now) clears the flag it holds.
        Run.objects.filter(pk=run.pk).update(pause_requested_at=None, updated_at=Now())
        append_event(
            run_id=run.pk, type="run.resumed", actor=actor, payload={"withdrawn": "pause_requested"}
        )
        run.refresh_from_db()
        transaction.on_commit(notify_control)
        return Outcome(run)
    if run.status != RunStatus.PAUSED:
        raise refuse(run, "resume")
    return Outcome(
        transition(
            run,
            to=RunStatus.QUEUED,
            event="run.resumed",
            actor=actor,
            pause_requested_at=None,
            run_after=Now(),
        )
    )


@transaction.atomic
def post_message(*, run: Run, actor: Actor, text: str) -> Outcome:
    """Append a message; a run waiting for one is queued again."""
    text = (text or "").strip()
    if not text:
        raise InvalidRunInput("text must not be empty")
    if problem := find_unstorable(text, where="text"):
        raise InvalidRunInput(problem)
    run = locked(run)
    if run.status in TERMINAL_STATUSES:
        raise refuse(run, "message")
    if run.thread_id is not None:
        # Its thread decides which turn reads a message (and wakes a held turn only in order).
        raise InvalidTransition(
            f"run {run.pk} is turn {run.turn} of thread {run.thread_id}: post to "
            f"/api/threads/{run.thread_id}/messages"
        )
    message = Message.objects.create(run=run, author_type=actor.type, author_id=actor.id, text=text)
    append_event(
        run_id=run.pk,
        type="message.received",
        actor=actor,
        payload={"message": message.pk, "text": text[:500]},
    )
    held_by_key = run.concurrency_key is not None and run.started_at is None
    if run.status == RunStatus.WAITING and run.children_pending == 0 and not held_by_key:
        transition(
            run,
            to=RunStatus.QUEUED,
            event="run.queued",
            actor=actor,
            payload={"reason": "message"},
            run_after=Now(),
        )
    return Outcome(run)
