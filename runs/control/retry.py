"""Retrying a failed or cancelled run, from where it stopped or from an earlier step."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Now

from runs.control.transition import Outcome, expires_from_now, locked, refuse, transition
from runs.engine import keys
from runs.events import Actor
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.limits import checked_cents, checked_deadline
from runs.models import Message, Run, RunStatus, Step, StepStatus
from runs.queries import queries

BOUND_KINDS = {"deadline", "budget", "step_limit"}


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
    bound: a larger ``deadline_seconds`` or ``cost_ceiling_cents``. A run of
    a concurrency key is retried only while no other run of its key is live.
    """
    tenant_id, key = Run.objects.values_list("tenant_id", "concurrency_key").get(pk=run.pk)
    if key is not None:
        keys.lock(tenant_id, key)  # before the run's row, as a submit of the key takes them
    run = locked(run)
    if run.status not in (RunStatus.FAILED, RunStatus.CANCELLED):
        raise refuse(run, "retry")
    if key is not None and (live := keys.live_runs(tenant_id, key)):
        raise InvalidTransition(
            f"run {live[0].id} of the same concurrency key {key!r} is {live[0].status}: "
            "retry this one once it has ended"
        )
    if run.thread_id is not None:
        from runs.threads.turns import retry_turn  # threads use the control layer

        retry_turn(run)
    fields: dict[str, Any] = {}
    if deadline_seconds is not None:
        fields["deadline_seconds"] = checked_deadline(deadline_seconds)
    if cost_ceiling_cents is not None:
        fields["cost_ceiling_cents"] = checked_cents(cost_ceiling_cents, field="cost_ceiling_cents")
    if run.status == RunStatus.FAILED and run.error_kind in BOUND_KINDS:
        _require_new_bound(run, fields, from_step)
    if run.compensation:
        # A rolled-back run starts again from its first undone step: what a
        # compensation undid is done again, the rollback stays in the old generation.
        from_step = _before_rollback(run, from_step)
        fields["compensation"] = ""
    if from_step is not None:
        fields.update(_archive_from(run, from_step))
    return Outcome(
        transition(
            run,
            to=RunStatus.QUEUED,
            event="run.retried",
            actor=actor,
            payload={"from_step": from_step},
            failures=0,
            error="",
            error_kind="",
            finished_at=None,
            run_after=Now(),
            cancel_requested_at=None,
            # What it reported describes the attempt that ended; the next ending reports again.
            outcome="",
            summary="",
            pause_requested_at=None,
            expires_at=expires_from_now(),
            # A person retried it: the time to live it was submitted with (expires_in) is spent.
            start_by=None,
            **fields,
        )
    )


def _before_rollback(run: Run, from_step: int | None) -> int | None:
    steps = Step.objects.filter(run=run, generation=run.generation)
    first = (
        steps.filter(Q(status=StepStatus.COMPENSATED) | Q(kind="compensation"))
        .order_by("seq")
        .values_list("seq", flat=True)
        .first()
    )
    if first is None:
        return from_step
    if from_step is not None and from_step > first:
        raise InvalidTransition(
            f"step {first} and later were rolled back: retry from step {first} or earlier"
        )
    return first if from_step is None else from_step


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
        raise InvalidTransition(
            "the run reached its kind's step limit: raise the limit, or retry from an earlier step"
        )


def _archive_from(run: Run, from_step: int) -> dict[str, Any]:
    """Start generation g+1 with steps 1..N-1 of generation g; steps N.. stay behind in g."""
    last = (
        Step.objects.filter(run=run, generation=run.generation)
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
        or 0
    )
    if not isinstance(from_step, int) or not 1 <= from_step <= last + 1:
        raise InvalidRunInput(f"from_step must be between 1 and {last + 1}")
    new_generation = run.generation + 1
    with connection.cursor() as cursor:
        cursor.execute(
            queries.archive_steps_from,
            {
                "new_generation": new_generation,
                "run": run.pk,
                "generation": run.generation,
                "from_step": from_step,
            },
        )
    Message.objects.filter(
        run=run, consumed_by_step__generation=run.generation, consumed_by_step__seq__gte=from_step
    ).update(consumed_by_step=None)
    done = Step.objects.filter(run=run, generation=new_generation, status=StepStatus.DONE).count()
    return {"generation": new_generation, "steps_done": done, "current_step": ""}
