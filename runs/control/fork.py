"""Forking a run: a new run that replays the origin's steps before N and runs from step N on.

"What if it had gone differently from step N": the fork has the origin's
tenant, kind, kind version, input, queue and priority, and a copy of the
origin's finished steps 1..N-1 (its current generation) as ``done``, so a
worker that claims it replays them for free and executes from step N. The
copies cost nothing (the money was spent by the origin) and keep their
recorded idempotency keys, so a keyed side effect before N is not repeated;
steps from N on get the fork's own run id in their default keys.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from runs.control.transition import locked
from runs.events import Actor, append_event
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.models import LIVE_STATUSES, Run, Step, StepKind, StepStatus
from runs.notify import count_and_notify_after_commit
from runs.queries import queries
from runs.services import check_queue_room, request_hash
from runs.tracing import current_trace_context


@transaction.atomic
def fork_run(*, run: Run, actor: Actor, from_step: int) -> Run:
    """Create a queued run that replays ``run``'s steps before ``from_step`` and executes from it on.

    ``from_step`` is between 1 and one past the last step of the run's
    current generation (``InvalidRunInput`` otherwise). Every step before it
    must be done, and a child run spawned before it must have finished and
    must not be gathered from it on (``InvalidTransition`` otherwise). The
    fork records its ``origin`` and ``origin_step``; webhooks
    (``callback_url``) and the idempotency key are not carried over. Subject
    to the tenant's queue limit like a submit (``QueueFull``).
    """
    origin = locked(
        run
    )  # a consistent generation, and no retry of the origin while its steps are copied
    if origin.thread_id is not None:
        raise InvalidTransition(
            f"run {origin.pk} is turn {origin.turn} of thread {origin.thread_id}: a turn is not "
            "forked (it would run outside its conversation); post a message to the thread instead"
        )
    steps = Step.objects.filter(run=origin, generation=origin.generation)
    last = steps.order_by("-seq").values_list("seq", flat=True).first() or 0
    if (
        isinstance(from_step, bool)
        or not isinstance(from_step, int)
        or not 1 <= from_step <= last + 1
    ):
        raise InvalidRunInput(
            f"from_step must be between 1 and {last + 1} (the run has {last} steps)"
        )
    _require_replayable(steps, from_step)
    steps_done = steps.filter(seq__lt=from_step).count()
    check_queue_room(origin.tenant)

    now = timezone.now()
    fork = Run(
        tenant_id=origin.tenant_id,
        kind=origin.kind,
        kind_version=origin.kind_version,  # its steps were recorded by that version
        queue=origin.queue,
        priority=origin.priority,
        input=origin.input,
        title=origin.title,
        request_hash=request_hash(
            kind=origin.kind, input=origin.input, queue=origin.queue, priority=origin.priority
        ),
        max_attempts=origin.max_attempts,
        deadline_seconds=origin.deadline_seconds,
        cost_ceiling_cents=origin.cost_ceiling_cents,
        origin=origin,
        origin_step=from_step,
        trace_context=current_trace_context()
        or origin.trace_context,  # the forking request's, else the origin's
        steps_done=steps_done,
        created_at=now,
        updated_at=now,
        expires_at=now + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS),
        last_event_seq=1,
    )
    fork.save(force_insert=True)
    with connection.cursor() as cursor:
        cursor.execute(
            queries.copy_steps_to_fork,
            {
                "fork": fork.pk,
                "origin": origin.pk,
                "generation": origin.generation,
                "from_step": from_step,
            },
        )
    append_event(
        run_id=fork.pk,
        type="run.queued",
        actor=actor,
        first=True,
        payload={
            "kind": fork.kind,
            "queue": fork.queue,
            "priority": fork.priority,
            "forked_from": str(origin.pk),
            "from_step": from_step,
        },
    )
    append_event(
        run_id=origin.pk,
        type="run.forked",
        actor=actor,
        payload={"fork": str(fork.pk), "from_step": from_step},
    )
    count_and_notify_after_commit(tenant_id=fork.tenant_id, queue=fork.queue)
    return fork


def _require_replayable(steps, from_step: int) -> None:
    """Steps before N replay when done; a spawn, when its child finished and no gather from N on awaits it.

    The fork replays a spawn as a handle on its origin's child, but that
    child wakes only its real parent, and a gather takes only the run's own
    children (a fork's gather of it fails the fork), so a fork may begin
    before the spawn or after the gather, not in between.
    """
    blocking = (
        steps.filter(seq__lt=from_step)
        .exclude(status=StepStatus.DONE)
        .order_by("seq")
        .values_list("seq", "status")
        .first()
    )
    if blocking is not None:
        seq, status = blocking
        raise InvalidTransition(
            f"step {seq} is {status}, not done: fork from step {seq} or earlier, so that it runs again in the fork"
        )
    spawned: dict[str, int] = {}
    gathered: dict[str, int] = {}
    child_steps = (
        steps.filter(kind=StepKind.CHILD).order_by("seq").values_list("seq", "input", "output")
    )
    for seq, step_input, output in child_steps:
        if seq < from_step and isinstance(output, dict) and "run_id" in output:  # a spawn
            spawned.setdefault(str(output["run_id"]), seq)
        elif seq >= from_step:
            for child in _gathered(step_input, output):
                gathered.setdefault(str(child), seq)
    for child, seq in spawned.items():
        if child in gathered:
            raise InvalidTransition(
                f"step {seq} spawned child run {child}, which step {gathered[child]} gathers, and a fork cannot "
                f"gather its origin's children: fork from step {seq} or earlier, or after step {gathered[child]}"
            )
    live = Run.objects.filter(pk__in=list(spawned), status__in=LIVE_STATUSES).values_list(
        "pk", flat=True
    )
    unfinished = sorted((spawned[str(pk)], pk) for pk in live)
    if unfinished:
        seq, child = unfinished[0]
        raise InvalidTransition(
            f"step {seq} spawned child run {child} which has not finished; fork after it finishes"
        )


def _gathered(step_input, output) -> list:
    """The children a gather step awaits: its outcomes once done, its input while it waits."""
    if isinstance(output, list):
        return [
            outcome["run_id"]
            for outcome in output
            if isinstance(outcome, dict) and "run_id" in outcome
        ]
    if isinstance(step_input, dict) and isinstance(step_input.get("children"), list):
        return step_input["children"]
    return []
