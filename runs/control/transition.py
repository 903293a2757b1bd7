"""The shape every person's action shares: lock, check, one guarded UPDATE, one Event."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from runs.db import notify_control
from runs.engine import family, keys
from runs.engine.turns import lock_thread_of, tell_turn_ended
from runs.events import Actor, append_event
from runs.exceptions import InvalidTransition
from runs.metrics import process as metrics
from runs.models import TERMINAL_STATUSES, Run, RunStatus, Tenant
from runs.notify import count_and_notify_after_commit


@dataclass(frozen=True)
class Outcome:
    run: Run
    later: bool = (
        False  # True when a worker carries the request out at its next step boundary (202)
    )


def locked(run: Run) -> Run:
    """``run`` read again under its row lock; a turn's thread is locked first (the lock order, runs.threads.turns)."""
    lock_thread_of(run.pk)
    return Run.objects.select_for_update().get(pk=run.pk)


def expires_from_now():
    """``expires_at`` of a run that starts waiting for people now, on the database's clock."""
    return Now() + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS)


def refuse(run: Run, action: str) -> InvalidTransition:
    return InvalidTransition(f"cannot {action} a run that is {run.status}")


def transition(
    run: Run, *, to: str, event: str, actor: Actor, payload: dict | None = None, **fields: Any
) -> Run:
    """One guarded UPDATE of a locked run plus its Event; ``run`` is read back after it.

    Times are the database's (``Now()``), like the engine's: an app server's
    clock never decides when a run becomes claimable. Pass ``Now()`` (or an
    expression of it) in ``fields`` for a time column.
    """
    values = {"status": to, "updated_at": Now(), **fields}
    if to in TERMINAL_STATUSES:
        values.setdefault("finished_at", Now())
    if run.status == RunStatus.WAITING:
        values.setdefault("wake_at", None)  # its timer, if any, is over
    updated = Run.objects.filter(pk=run.pk, status=run.status).update(**values)
    if updated != 1:  # cannot happen under the row lock; never overwrite silently
        raise InvalidTransition(f"the run changed state while {event} was being applied")
    previous = run.status
    append_event(
        run_id=run.pk,
        type=event,
        actor=actor,
        payload={"from": previous, "to": to, **(payload or {})},
    )
    run.refresh_from_db()
    if to == RunStatus.QUEUED:
        count_and_notify_after_commit(tenant_id=run.tenant_id, queue=run.queue)
    if previous == RunStatus.QUEUED:
        Tenant.objects.filter(pk=run.tenant_id).update(queued=F("queued") - 1)
    if to in TERMINAL_STATUSES:
        _family_after(run, to)
        if run.thread_id is not None:
            tell_turn_ended(run.pk, actor=actor)
        if run.concurrency_key is not None:
            keys.release_after_commit(run.tenant_id, run.concurrency_key)
        queue, kind = run.queue, run.kind
        transaction.on_commit(lambda: metrics.run_finished(queue=queue, kind=kind, status=to))
    return run


def _family_after(run: Run, to: str) -> None:
    """A finished child tells its parent, in this transaction (a parent's own children: ``cancel_children``)."""
    if run.parent_id is not None:
        family.wake_after_commit(
            family.child_finished(
                child_id=run.pk, parent_id=run.parent_id, succeeded=to == RunStatus.DONE
            )
        )


def request(run: Run, *, field: str, event: str, actor: Actor, payload: dict | None = None) -> Run:
    """Ask the worker holding a running run to act at its next step boundary."""
    if getattr(run, field) is None:
        Run.objects.filter(pk=run.pk).update(**{field: Now(), "updated_at": Now()})
        append_event(run_id=run.pk, type=event, actor=actor, payload=payload)
        run.refresh_from_db()
    # Wake the worker's heartbeat so a long step sees ctx.cancelled soon.
    transaction.on_commit(notify_control)
    return run
