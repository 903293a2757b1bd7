"""People's decisions on a run waiting for them: approve or reject a proposal, resolve a doubtful side effect."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.expressions import CombinedExpression
from django.db.models.functions import Now

from runs.actors import describe_actor
from runs.control.lifecycle import cancel_children_after_commit
from runs.control.transition import Outcome, locked, transition
from runs.db import db_now, dumps
from runs.events import Actor
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.models import Compensation, Run, RunStatus, Step, StepStatus
from runs.text import find_unstorable


def _pending_step(run: Run, *, approval: bool) -> Step | None:
    steps = Step.objects.filter(run=run, generation=run.generation)
    if approval:
        return steps.filter(status=StepStatus.WAITING, kind="approval").order_by("-seq").first()
    if run.compensation == Compensation.RUNNING:
        # A rollback parked on a compensation that failed (or was interrupted).
        return (
            steps.filter(
                kind="compensation",
                status__in=[StepStatus.WAITING, StepStatus.FAILED, StepStatus.RUNNING],
            )
            .order_by("-seq")
            .first()
        )
    # Steps that wait for time, messages or children are not a person's to resolve.
    return (
        steps.filter(status=StepStatus.WAITING)
        .exclude(kind__in=["approval", "sleep", "message", "child"])
        .order_by("-seq")
        .first()
    )


@transaction.atomic
def decide_approval(
    *, run: Run, actor: Actor, approved: bool, comment: str = "", step: int | None = None
) -> Outcome:
    """Approve or reject the pending approval; the run is queued and ``ctx.approval`` returns the decision."""
    if problem := find_unstorable(comment, where="comment"):
        raise InvalidRunInput(problem)
    run = locked(run)
    pending = _pending_step(run, approval=True) if run.status == RunStatus.WAITING_HUMAN else None
    if pending is None:
        raise InvalidTransition(f"the run has no pending approval (it is {run.status})")
    if step is not None and step != pending.seq:
        raise InvalidTransition(f"step {step} is not the pending approval (step {pending.seq} is)")
    now = db_now()
    # The name as it is now: a replay tells the agent the same words even after a rename.
    decision = {
        "approved": approved,
        "comment": comment,
        "by": f"{actor.type}:{actor.id}",
        "by_name": describe_actor(actor.type, actor.id, tenant_id=run.tenant_id),
        "at": now.isoformat(),
    }
    Step.objects.filter(pk=pending.pk, status=StepStatus.WAITING).update(
        status=StepStatus.DONE, output=decision, ended_at=now
    )
    verb = "approved" if approved else "rejected"
    # A decided approval is a finished step, like one the engine checkpoints.
    return Outcome(
        transition(
            run,
            to=RunStatus.QUEUED,
            event=f"run.{verb}",
            actor=actor,
            run_after=Now(),
            payload={"step": pending.seq, "name": pending.name, "comment": comment},
            steps_done=F("steps_done") + 1,
        )
    )


def approve_run(*, run: Run, actor: Actor, comment: str = "", step: int | None = None) -> Outcome:
    return decide_approval(run=run, actor=actor, approved=True, comment=comment, step=step)


def reject_run(*, run: Run, actor: Actor, comment: str = "", step: int | None = None) -> Outcome:
    return decide_approval(run=run, actor=actor, approved=False, comment=comment, step=step)


RESOLVE_ACTIONS = ("done", "retry", "fail", "skip")


@transaction.atomic
def resolve_run(*, run: Run, actor: Actor, action: str, output: Any = None) -> Outcome:
    """Decide an ambiguous side effect: ``done`` (record ``output``), ``retry`` the step, or ``fail`` the run.

    A run whose agent code raised ``Ambiguous`` between steps has no step to
    decide on: ``done`` then finishes the run with ``output`` as its result,
    ``retry`` runs its code again from the step log, ``fail`` fails it.

    A rollback parked on a compensation that kept failing is decided the
    same way: ``retry`` the compensation, ``done`` (it was undone by hand),
    ``skip`` it (the step stays done, and the run says it was not undone),
    or ``fail`` the run there.
    """
    if action not in RESOLVE_ACTIONS:
        raise InvalidRunInput("action must be one of: done, retry, fail, skip")
    if action == "done":
        try:
            dumps(output)
        except (TypeError, ValueError):
            raise InvalidRunInput("output must be JSON (no NaN or infinity)") from None
        if problem := find_unstorable(output, where="output"):
            raise InvalidRunInput(problem)
    run = locked(run)
    pending = _pending_step(run, approval=False) if run.status == RunStatus.WAITING_HUMAN else None
    # Without a waiting step, only a run parked as ambiguous between steps has
    # something to resolve (a pending approval parks with no error_kind).
    if pending is None and (run.status != RunStatus.WAITING_HUMAN or run.error_kind != "ambiguous"):
        raise InvalidTransition(f"the run has no step waiting to be resolved (it is {run.status})")
    rolling_back = run.compensation == Compensation.RUNNING
    if action == "skip" and (pending is None or not rolling_back):
        raise InvalidTransition("only a compensation can be skipped")
    payload = {
        "step": pending.seq if pending else None,
        "name": pending.name if pending else None,
        "action": action,
    }
    if rolling_back and pending is not None:
        return _resolve_compensation(
            run, pending, actor=actor, action=action, output=output, payload=payload
        )
    if pending is None:
        if action == "done":
            return Outcome(
                transition(
                    run,
                    to=RunStatus.DONE,
                    event="run.done",
                    actor=actor,
                    payload=payload | {"result": output},
                    result=output,
                    error="",
                    error_kind="",
                )
            )
    elif action == "done":
        Step.objects.filter(pk=pending.pk).update(
            status=StepStatus.DONE, output=output, ended_at=Now()
        )
    else:
        Step.objects.filter(pk=pending.pk).update(status=StepStatus.FAILED, ended_at=Now())
    if action in ("done", "retry"):
        counted: dict[str, int | CombinedExpression] = {"failures": 0} if action == "retry" else {}
        if action == "done" and pending is not None:
            counted["steps_done"] = F("steps_done") + 1  # the person finished the step
        return Outcome(
            transition(
                run,
                to=RunStatus.QUEUED,
                event="run.resolved",
                actor=actor,
                payload=payload,
                run_after=Now(),
                error="",
                error_kind="",
                **counted,
            )
        )
    # Terminal events keep their type (webhooks listen for run.failed).
    failed = transition(
        run,
        to=RunStatus.FAILED,
        event="run.failed",
        actor=actor,
        payload=payload,
        error_kind="ambiguous",
    )
    cancel_children_after_commit(failed)
    return Outcome(failed)


def _resolve_compensation(
    run: Run, pending: Step, *, actor: Actor, action: str, output: Any, payload: dict
) -> Outcome:
    if action == "fail":
        failed = transition(
            run,
            to=RunStatus.FAILED,
            event="run.failed",
            actor=actor,
            payload=payload,
            compensation=Compensation.PARTIAL,
        )
        cancel_children_after_commit(failed)
        return Outcome(failed)
    if action in ("done", "skip"):
        recorded = (
            output if action == "done" else {"skipped": True, "by": f"{actor.type}:{actor.id}"}
        )
        Step.objects.filter(pk=pending.pk).update(
            status=StepStatus.DONE, output=recorded, error="", ended_at=Now()
        )
        undoes = (
            (pending.input or {}).get("compensates") if isinstance(pending.input, dict) else None
        )
        if action == "done" and undoes is not None:
            Step.objects.filter(
                run=run, generation=run.generation, seq=undoes, status=StepStatus.DONE
            ).update(status=StepStatus.COMPENSATED)
    return Outcome(
        transition(
            run,
            to=RunStatus.QUEUED,
            event="run.resolved",
            actor=actor,
            payload=payload,
            run_after=Now(),
            failures=0,
        )
    )
