"""Control endpoints of the runs Router: people acting on live runs (see runs.control)."""

from __future__ import annotations

from uuid import UUID

from django.http import HttpResponse
from ninja import Status

from runs import control, kinds, selectors
from runs.api.auth import ApiRequest, actor_of
from runs.api.endpoints import ERRORS, require_scope, router
from runs.api.schemas import CancelIn, DecisionIn, ForkIn, MessageIn, ResolveIn, RetryIn, RunOut
from runs.models import ApiKey

RESPONSES = {200: RunOut, 202: RunOut} | ERRORS


def _target(request: ApiRequest, run_id: UUID, scope: str):
    """401 (auth) → 404 (another tenant's run) → 403 (scope), in that order."""
    run = selectors.get_run(tenant=request.auth.tenant, run_id=run_id)
    require_scope(request, scope)
    return run, actor_of(request.auth)


def _answer(outcome: control.Outcome):
    return Status(202 if outcome.later else 200, outcome.run)


@router.post(
    "/runs/{run_id}/cancel",
    response=RESPONSES,
    summary="Cancel a run (202: at its next step boundary)",
)
def cancel(request: ApiRequest, run_id: UUID, payload: CancelIn | None = None):
    run, actor = _target(request, run_id, ApiKey.Scope.WRITE)
    payload = payload or CancelIn()
    return _answer(control.cancel_run(run=run, actor=actor, compensate=payload.compensate))


@router.post(
    "/runs/{run_id}/pause",
    response=RESPONSES,
    summary="Pause a run (202: at its next step boundary)",
)
def pause(request: ApiRequest, run_id: UUID):
    run, actor = _target(request, run_id, ApiKey.Scope.WRITE)
    return _answer(control.pause_run(run=run, actor=actor))


@router.post("/runs/{run_id}/resume", response=RESPONSES, summary="Resume a paused run")
def resume(request: ApiRequest, run_id: UUID):
    run, actor = _target(request, run_id, ApiKey.Scope.WRITE)
    return _answer(control.resume_run(run=run, actor=actor))


@router.post("/runs/{run_id}/approve", response=RESPONSES, summary="Approve the pending approval")
def approve(request: ApiRequest, run_id: UUID, payload: DecisionIn | None = None):
    run, actor = _target(request, run_id, ApiKey.Scope.APPROVE)
    payload = payload or DecisionIn()
    return _answer(
        control.approve_run(run=run, actor=actor, comment=payload.comment, step=payload.step)
    )


@router.post("/runs/{run_id}/reject", response=RESPONSES, summary="Reject the pending approval")
def reject(request: ApiRequest, run_id: UUID, payload: DecisionIn | None = None):
    run, actor = _target(request, run_id, ApiKey.Scope.APPROVE)
    payload = payload or DecisionIn()
    return _answer(
        control.reject_run(run=run, actor=actor, comment=payload.comment, step=payload.step)
    )


@router.post(
    "/runs/{run_id}/resolve", response=RESPONSES, summary="Resolve an ambiguous side effect"
)
def resolve(request: ApiRequest, run_id: UUID, payload: ResolveIn):
    run, actor = _target(request, run_id, ApiKey.Scope.APPROVE)
    return _answer(
        control.resolve_run(run=run, actor=actor, action=payload.action, output=payload.output)
    )


@router.post("/runs/{run_id}/messages", response=RESPONSES, summary="Send a message to a run")
def message(request: ApiRequest, run_id: UUID, payload: MessageIn):
    run, actor = _target(request, run_id, ApiKey.Scope.WRITE)
    return _answer(control.post_message(run=run, actor=actor, text=payload.text))


@router.post("/runs/{run_id}/retry", response=RESPONSES, summary="Retry a failed or cancelled run")
def retry(request: ApiRequest, run_id: UUID, payload: RetryIn | None = None):
    run, actor = _target(request, run_id, ApiKey.Scope.WRITE)
    payload = payload or RetryIn()
    return _answer(
        control.retry_run(
            run=run,
            actor=actor,
            from_step=payload.from_step,
            deadline_seconds=payload.deadline_seconds,
            cost_ceiling_cents=payload.cost_ceiling_cents,
        )
    )


@router.post(
    "/runs/{run_id}/fork",
    response={202: RunOut} | ERRORS,
    summary="Fork a run: a new run that replays steps before N and runs from N (202, queued)",
)
def fork(request: ApiRequest, response: HttpResponse, run_id: UUID, payload: ForkIn):
    run, actor = _target(request, run_id, ApiKey.Scope.WRITE)
    # A fork starts a new run of the kind: only of a kind the tenant may start (a retry is not a new run).
    kinds.require_startable(request.auth.tenant, run.kind)
    forked = control.fork_run(run=run, actor=actor, from_step=payload.from_step)
    response["Location"] = f"/api/runs/{forked.id}"
    return Status(202, forked)
