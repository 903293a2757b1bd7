"""People acting on live runs: cancel, pause, resume, approve, reject, resolve, message, retry.

Each action is a service used by the API, the dashboard and the admin alike:
it locks the run row, checks the state it expects (raising
``InvalidTransition``, a 409, otherwise), makes one guarded UPDATE and writes
an Event naming who acted, all in one transaction. A run that goes back to
the queue is counted and announced to workers after the commit. A running
run is never changed under its worker: a cancel or pause is a request the
worker honours at its next step boundary (answered 202).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.models import TERMINAL_STATUSES, Event, Message, Run, RunStatus, Step, StepStatus, Tenant
from runs.notify import count_and_notify_after_commit
from runs.services import Actor
from workers.queue import NOTIFY_CHANNEL

WAITING_STATES = {RunStatus.WAITING, RunStatus.WAITING_HUMAN, RunStatus.PAUSED}
BOUND_KINDS = {"deadline", "budget", "step_limit"}


@dataclass(frozen=True)
class Outcome:
    run: Run
    later: bool = False  # True when a worker carries the request out at its next step boundary (202)


def _locked(run: Run) -> Run:
    return Run.objects.select_for_update().get(pk=run.pk)


def _transition(run: Run, *, to: str, event: str, actor: Actor, payload: dict | None = None, **fields: Any) -> Run:
    """One guarded UPDATE of a locked run plus its Event; ``run`` is updated in memory."""
    now = timezone.now()
    seq = run.last_event_seq + 1
    values = {"status": to, "last_event_seq": seq, "updated_at": now, **fields}
    if to in TERMINAL_STATUSES:
        values.setdefault("finished_at", now)
    updated = Run.objects.filter(pk=run.pk, status=run.status).update(**values)
    if updated != 1:  # cannot happen under the row lock; never overwrite silently
        raise InvalidTransition(f"the run changed state while {event} was being applied")
    previous = run.status
    for name, value in values.items():
        setattr(run, name, value)
    Event.objects.create(
        run=run, seq=seq, type=event, actor_type=actor.type, actor_id=actor.id,
        payload={"from": previous, "to": to, **(payload or {})}, created_at=now,
    )
    if to == RunStatus.QUEUED:
        count_and_notify_after_commit(tenant_id=run.tenant_id, queue=run.queue)
    if previous == RunStatus.QUEUED:
        Tenant.objects.filter(pk=run.tenant_id).update(queued=F("queued") - 1)
    return run


def _request(run: Run, *, field: str, event: str, actor: Actor) -> Run:
    """Ask the worker holding a running run to act at its next step boundary."""
    now = timezone.now()
    if getattr(run, field) is None:
        seq = run.last_event_seq + 1
        Run.objects.filter(pk=run.pk).update(**{field: now, "last_event_seq": seq, "updated_at": now})
        setattr(run, field, now)
        run.last_event_seq = seq
        Event.objects.create(run=run, seq=seq, type=event, actor_type=actor.type, actor_id=actor.id, payload={})
    # Wake the worker's heartbeat so a long step sees ctx.cancelled soon.
    transaction.on_commit(_notify_control)
    return run


def _notify_control() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, 'control')", [NOTIFY_CHANNEL])


def _refuse(run: Run, action: str) -> InvalidTransition:
    return InvalidTransition(f"cannot {action} a run that is {run.status}")


@transaction.atomic
def cancel_run(*, run: Run, actor: Actor) -> Outcome:
    """Cancel at once, or (running) at the run's next step boundary."""
    run = _locked(run)
    if run.status == RunStatus.RUNNING:
        return Outcome(_request(run, field="cancel_requested_at", event="run.cancel_requested", actor=actor), later=True)
    if run.status in TERMINAL_STATUSES:
        raise _refuse(run, "cancel")
    return Outcome(_transition(run, to=RunStatus.CANCELLED, event="run.cancelled", actor=actor, cancel_requested_at=timezone.now()))


@transaction.atomic
def pause_run(*, run: Run, actor: Actor) -> Outcome:
    """Pause a queued run at once, or a running one at its next step boundary (it releases its worker)."""
    run = _locked(run)
    if run.status == RunStatus.RUNNING:
        return Outcome(_request(run, field="pause_requested_at", event="run.pause_requested", actor=actor), later=True)
    if run.status != RunStatus.QUEUED:
        raise _refuse(run, "pause")
    return Outcome(_transition(
        run, to=RunStatus.PAUSED, event="run.paused", actor=actor, pause_requested_at=timezone.now(),
        expires_at=timezone.now() + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS),
    ))


@transaction.atomic
def resume_run(*, run: Run, actor: Actor) -> Outcome:
    """Queue a paused run again (it continues from its step log); withdraw a pause not yet honoured."""
    run = _locked(run)
    if run.status == RunStatus.RUNNING and run.pause_requested_at is not None:
        # Withdraw a pause the worker has not honoured yet; its heartbeat
        # (woken now) clears the flag it holds.
        now = timezone.now()
        seq = run.last_event_seq + 1
        Run.objects.filter(pk=run.pk).update(pause_requested_at=None, last_event_seq=seq, updated_at=now)
        run.pause_requested_at, run.last_event_seq = None, seq
        Event.objects.create(run=run, seq=seq, type="run.resumed", actor_type=actor.type,
                             actor_id=actor.id, payload={"withdrawn": "pause_requested"})
        transaction.on_commit(_notify_control)
        return Outcome(run)
    if run.status != RunStatus.PAUSED:
        raise _refuse(run, "resume")
    return Outcome(_transition(
        run, to=RunStatus.QUEUED, event="run.resumed", actor=actor, pause_requested_at=None, run_after=timezone.now(),
    ))


def _pending_step(run: Run, *, approval: bool) -> Step | None:
    steps = Step.objects.filter(run=run, generation=run.generation, status=StepStatus.WAITING)
    steps = steps.filter(kind="approval") if approval else steps.exclude(kind="approval")
    return steps.order_by("-seq").first()


@transaction.atomic
def decide_approval(*, run: Run, actor: Actor, approved: bool, comment: str = "", step: int | None = None) -> Outcome:
    """Approve or reject the pending approval; the run is queued and ``ctx.approval`` returns the decision."""
    run = _locked(run)
    pending = _pending_step(run, approval=True) if run.status == RunStatus.WAITING_HUMAN else None
    if pending is None:
        raise InvalidTransition(f"the run has no pending approval (it is {run.status})")
    if step is not None and step != pending.seq:
        raise InvalidTransition(f"step {step} is not the pending approval (step {pending.seq} is)")
    now = timezone.now()
    decision = {"approved": approved, "comment": comment, "by": f"{actor.type}:{actor.id}", "at": now.isoformat()}
    Step.objects.filter(pk=pending.pk, status=StepStatus.WAITING).update(status=StepStatus.DONE, output=decision, ended_at=now)
    verb = "approved" if approved else "rejected"
    return Outcome(_transition(
        run, to=RunStatus.QUEUED, event=f"run.{verb}", actor=actor, run_after=now,
        payload={"step": pending.seq, "name": pending.name, "comment": comment},
    ))


def approve_run(*, run: Run, actor: Actor, comment: str = "", step: int | None = None) -> Outcome:
    return decide_approval(run=run, actor=actor, approved=True, comment=comment, step=step)


def reject_run(*, run: Run, actor: Actor, comment: str = "", step: int | None = None) -> Outcome:
    return decide_approval(run=run, actor=actor, approved=False, comment=comment, step=step)


@transaction.atomic
def resolve_run(*, run: Run, actor: Actor, action: str, output: Any = None) -> Outcome:
    """Decide an ambiguous side effect: ``done`` (record ``output``), ``retry`` the step, or ``fail`` the run."""
    if action not in {"done", "retry", "fail"}:
        raise InvalidRunInput("action must be one of: done, retry, fail")
    run = _locked(run)
    pending = _pending_step(run, approval=False) if run.status == RunStatus.WAITING_HUMAN else None
    if pending is None:
        raise InvalidTransition(f"the run has no step waiting to be resolved (it is {run.status})")
    now = timezone.now()
    payload = {"step": pending.seq, "name": pending.name, "action": action}
    if action == "done":
        try:
            json.dumps(output)
        except TypeError:
            raise InvalidRunInput("output must be JSON") from None
        Step.objects.filter(pk=pending.pk).update(status=StepStatus.DONE, output=output, ended_at=now)
        return Outcome(_transition(run, to=RunStatus.QUEUED, event="run.resolved", actor=actor, payload=payload,
                                   run_after=now, error="", error_kind=""))
    Step.objects.filter(pk=pending.pk).update(status=StepStatus.FAILED, ended_at=now)
    if action == "retry":
        return Outcome(_transition(run, to=RunStatus.QUEUED, event="run.resolved", actor=actor, payload=payload,
                                   run_after=now, failures=0, error="", error_kind=""))
    # Terminal events keep their type (webhooks listen for run.failed).
    return Outcome(_transition(run, to=RunStatus.FAILED, event="run.failed", actor=actor, payload=payload,
                               error_kind="ambiguous"))


@transaction.atomic
def post_message(*, run: Run, actor: Actor, text: str) -> Outcome:
    """Append a message; a run waiting for one is queued again."""
    text = (text or "").strip()
    if not text:
        raise InvalidRunInput("text must not be empty")
    run = _locked(run)
    if run.status in TERMINAL_STATUSES:
        raise _refuse(run, "message")
    Message.objects.create(run=run, author_type=actor.type, author_id=actor.id, text=text)
    if run.status == RunStatus.WAITING and run.children_pending == 0:
        _transition(run, to=RunStatus.QUEUED, event="run.queued", actor=actor, payload={"reason": "message"},
                    run_after=timezone.now())
    return Outcome(run)


@transaction.atomic
def retry_run(
    *,
    run: Run,
    actor: Actor,
    from_step: int | None = None,
    deadline_seconds: int | None = None,
    cost_ceiling_cents: Decimal | float | None = None,
) -> Outcome:
    """Queue a failed or cancelled run again with a fresh retry budget; finished steps replay.

    ``from_step=N`` discards steps N and later (kept in the previous
    generation for the audit trail), hands their messages back, keeps the
    money spent, and re-runs them. A run that failed on a bound needs a new
    bound: a larger ``deadline_seconds`` or ``cost_ceiling_cents``.
    """
    run = _locked(run)
    if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        raise _refuse(run, "retry")
    fields: dict[str, Any] = {}
    if deadline_seconds is not None:
        fields["deadline_seconds"] = deadline_seconds
    if cost_ceiling_cents is not None:
        fields["cost_ceiling_cents"] = Decimal(str(cost_ceiling_cents))
    if run.status == RunStatus.FAILED and run.error_kind in BOUND_KINDS:
        _require_new_bound(run, fields, from_step)
    if from_step is not None:
        fields.update(_archive_from(run, from_step))
    now = timezone.now()
    return Outcome(_transition(
        run, to=RunStatus.QUEUED, event="run.retried", actor=actor, payload={"from_step": from_step},
        failures=0, error="", error_kind="", finished_at=None, run_after=now, cancel_requested_at=None,
        pause_requested_at=None, expires_at=now + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS), **fields,
    ))


def _require_new_bound(run: Run, fields: dict, from_step: int | None) -> None:
    if run.error_kind == "deadline" and fields.get("deadline_seconds", 0) <= run.running_seconds:
        raise InvalidTransition(
            f"the run used {run.running_seconds:.0f} s of its {run.deadline_seconds} s deadline: "
            "retry with a larger deadline_seconds"
        )
    if run.error_kind == "budget":
        ceiling = fields.get("cost_ceiling_cents")
        if ceiling is None or ceiling <= run.cost_cents:
            raise InvalidTransition(
                f"the run spent {run.cost_cents}¢ of its {run.cost_ceiling_cents}¢ ceiling: "
                "retry with a larger cost_ceiling_cents"
            )
    if run.error_kind == "step_limit" and from_step is None:
        raise InvalidTransition("the run reached its kind's step limit: raise the limit, or retry from an earlier step")


def _archive_from(run: Run, from_step: int) -> dict[str, Any]:
    """Start generation g+1 with steps 1..N-1 of generation g; steps N.. stay behind in g."""
    last = Step.objects.filter(run=run, generation=run.generation).order_by("-seq").values_list("seq", flat=True).first() or 0
    if not 1 <= from_step <= last + 1:
        raise InvalidRunInput(f"from_step must be between 1 and {last + 1}")
    new_generation = run.generation + 1
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO runs_step (run_id, generation, seq, name, kind, input, output, idempotency_key, tokens_in,"
            " tokens_out, cost_cents, status, executions, error, started_at, ended_at)"
            " SELECT run_id, %s, seq, name, kind, input, output, idempotency_key, 0, 0, 0, status, executions,"
            " error, started_at, ended_at FROM runs_step WHERE run_id = %s AND generation = %s AND seq < %s",
            [new_generation, run.pk, run.generation, from_step],
        )
    Message.objects.filter(
        run=run, consumed_by_step__generation=run.generation, consumed_by_step__seq__gte=from_step
    ).update(consumed_by_step=None)
    done = Step.objects.filter(run=run, generation=new_generation, status=StepStatus.DONE).count()
    return {"generation": new_generation, "steps_done": done, "current_step": ""}
