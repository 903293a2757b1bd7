"""Write services of the run domain (HackSoft style: keyword-only, annotated)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, TypedDict, Unpack

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, IntegrityError, connection, connections, transaction
from django.db.models.expressions import DatabaseDefault
from django.utils import timezone

from runs import payloads
from runs.db import dumps
from runs.engine import keys
from runs.events import SYSTEM, Actor
from runs.exceptions import (
    IdempotencyConflict,
    InvalidAgentInput,
    InvalidRunInput,
    InvalidTransition,
    QueueFull,
)
from runs.kinds import unknown_kind
from runs.limits import checked_cents, checked_deadline, checked_expires_in, checked_int
from runs.models import Run, RunStatus, Tenant, Thread
from runs.notify import count_and_notify_after_commit, uncounted_submits
from runs.queries import one, queries
from runs.registry import QUEUE_NAME, all_kinds, declared_queues, get_kind
from runs.text import find_unstorable
from runs.titles import title_for
from runs.tracing import current_trace_context
from runs.webhooks import targets

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Submitted:
    run: Run
    created: bool  # False when an idempotency key matched an existing run


def request_hash(*, kind: str, input: Any, queue: str, priority: int) -> str:
    canonical = json.dumps(
        {"kind": kind, "input": input, "queue": queue, "priority": priority},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


class SubmitOptions(TypedDict, total=False):
    queue: str | None
    priority: int | None
    idempotency_key: str | None
    max_attempts: int | None
    cost_ceiling_cents: Decimal | float | int | None
    deadline_seconds: int | None
    callback_url: str
    actor: Actor
    run_after: datetime | None
    expires_in: float | int | timedelta | None
    concurrency_key: str | None
    on_conflict: str


def submit_run(*, tenant: Tenant, kind: str, input: Any, **options: Unpack[SubmitOptions]) -> Run:
    """Validate and queue a run; inside the caller's transaction it commits or rolls back with it.

    Same validation, idempotency and backpressure as ``POST /api/runs``: an
    ``idempotency_key`` already used with the same normalised request
    (kind, input, queue, priority after defaults) returns that run; used
    with another request raises ``IdempotencyConflict``. Options:
    ``queue``, ``priority`` (0-9, lower first), ``idempotency_key``,
    ``max_attempts``, ``cost_ceiling_cents``, ``deadline_seconds``,
    ``callback_url``, ``actor`` (recorded on the run's first event),
    ``run_after`` (an aware datetime: the run waits in the queue until then),
    ``expires_in`` (seconds or a timedelta: a run not started that long after
    the submit is never claimed and fails ``expired``), ``concurrency_key``
    with ``on_conflict`` (at most one active run per key of the tenant;
    ``runs.engine.keys`` says what each policy does).
    """
    return submit(tenant=tenant, kind=kind, input=input, **options).run


def submit(
    *,
    tenant: Tenant,
    kind: str,
    input: Any,
    queue: str | None = None,
    priority: int | None = None,
    idempotency_key: str | None = None,
    max_attempts: int | None = None,
    cost_ceiling_cents: Decimal | float | int | None = None,
    deadline_seconds: int | None = None,
    callback_url: str = "",
    actor: Actor = SYSTEM,
    run_after: datetime | None = None,
    expires_in: float | int | timedelta | None = None,
    concurrency_key: str | None = None,
    on_conflict: str = "enqueue",
    parent: Run | None = None,
    tenant_is_fresh: bool = False,
    thread: Thread | None = None,
    turn: int | None = None,
    held_after: int | None = None,
    schedule: Any = None,
) -> Submitted:
    """``submit_run`` that also tells whether the run was created or found by its idempotency key.

    ``parent`` makes the run a child of that run (``spawn_child``).
    ``thread`` and ``turn`` make it that turn of a conversation
    (``runs.threads.turns.start_turn``, under the thread's lock); with
    ``held_after`` it is held (``waiting``) until turn ``held_after`` and
    those before it have ended. ``schedule`` is the Schedule whose fire
    submits it (``runs.schedules``).
    ``tenant_is_fresh`` says that ``tenant`` was read in this request (the
    API's key lookup reads it): backpressure then takes its queued counter
    from it instead of reading the row again.
    """
    _check_text(
        kind=kind,
        queue=queue,
        idempotency_key=idempotency_key,
        concurrency_key=concurrency_key,
        callback_url=callback_url,
        input=input,
    )
    agent_kind, normalised = validated_input(kind, input)
    queue = queue or agent_kind.queue
    if not QUEUE_NAME.match(queue):
        raise InvalidRunInput(
            f"invalid queue name {queue!r}: use lowercase letters, digits, '_', '-' and '.'"
        )
    if queue != agent_kind.queue and queue not in known_queues():
        raise InvalidRunInput(
            f"unknown queue {queue!r}; known queues: {', '.join(sorted(known_queues()))} "
            "(a queue is known when a kind uses it by default, it is listed in RUNS_QUEUES, or an operator created it)"
        )
    priority = 5 if priority is None else priority
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidRunInput("priority must be between 0 and 9 (lower runs first)")
    if max_attempts is None:
        max_attempts = agent_kind.max_attempts or settings.RUNS_MAX_ATTEMPTS
    max_attempts = checked_int(max_attempts, field="max_attempts", minimum=1, maximum=100)
    if deadline_seconds is None:
        deadline_seconds = (
            int(agent_kind.deadline.total_seconds())
            if agent_kind.deadline
            else settings.RUNS_DEADLINE_SECONDS
        )
    deadline_seconds = checked_deadline(deadline_seconds)
    if cost_ceiling_cents is None:
        cost_ceiling_cents = agent_kind.cost_ceiling_cents
    if cost_ceiling_cents is None:
        cost_ceiling_cents = tenant.default_cost_ceiling_cents
    if cost_ceiling_cents is not None:
        cost_ceiling_cents = checked_cents(cost_ceiling_cents, field="cost_ceiling_cents")
    if run_after is not None and (
        not isinstance(run_after, datetime) or timezone.is_naive(run_after)
    ):
        raise InvalidRunInput("run_after must be an aware datetime")
    time_to_live = checked_expires_in(expires_in) if expires_in is not None else None
    if concurrency_key is not None:
        if not isinstance(concurrency_key, str) or not 1 <= len(concurrency_key) <= 255:
            raise InvalidRunInput("concurrency_key must be 1 to 255 characters")
        if thread is not None or held_after is not None:
            raise InvalidRunInput(
                "a turn of a thread takes no concurrency_key: its thread is its key"
            )
    if on_conflict not in keys.ON_CONFLICT:
        raise InvalidRunInput(f"on_conflict must be one of {', '.join(keys.ON_CONFLICT)}")
    if idempotency_key is not None and not (1 <= len(idempotency_key) <= 255):
        raise InvalidRunInput("idempotency_key must be 1 to 255 characters")
    if callback_url:
        try:
            targets.check_url(callback_url)
        except targets.Refused as exc:
            raise InvalidRunInput(f"callback_url cannot be delivered to: {exc}") from None

    offload = payloads.offload_input(normalised)  # past RUNS_PAYLOAD_MAX_BYTES: PayloadTooLarge
    digest = request_hash(kind=kind, input=normalised, queue=queue, priority=priority)
    if idempotency_key is not None:
        existing = _existing(tenant, idempotency_key, digest)
        if existing is not None:
            return Submitted(run=existing, created=False)
    # After the idempotency lookup, so that a retried submit still gets its run.
    check_queue_room(tenant, fresh=tenant_is_fresh)

    now = timezone.now()
    start_by = now + time_to_live if time_to_live is not None else None
    if start_by is not None and run_after is not None and run_after >= start_by:
        raise InvalidRunInput(
            "expires_in ends before run_after: the run would expire before it may start"
        )
    run = Run(
        tenant=tenant,
        kind=kind,
        queue=queue,
        priority=priority,
        input=normalised,
        title=title_for(agent_kind, normalised),
        max_attempts=max_attempts,
        deadline_seconds=deadline_seconds,
        cost_ceiling_cents=cost_ceiling_cents,
        idempotency_key=idempotency_key,
        request_hash=digest,
        callback_url=callback_url,
        parent=parent,
        # Traced under the submitting request's span, or a child under its parent's.
        trace_context=current_trace_context()
        or (parent.trace_context if parent is not None else None),
        created_at=now,
        updated_at=now,
        expires_at=now + timedelta(seconds=settings.RUNS_EXPIRES_SECONDS),
        start_by=start_by,
        last_event_seq=1,
        thread=thread,
        turn=turn,
        schedule=schedule,
    )
    if held_after is not None:
        run.status = RunStatus.WAITING
    if run_after is not None:
        run.run_after = run_after  # else the database's now(), its db_default
    payload = (
        {"kind": kind, "queue": queue, "priority": priority}
        | ({"parent": str(parent.pk)} if parent is not None else {})
        | ({"thread": str(thread.pk), "turn": turn} if thread is not None else {})
        | ({"reason": "turn", "after_turn": held_after} if held_after is not None else {})
    )
    if concurrency_key is None:
        inserted = _insert(run, offload, actor=actor, payload=payload)
    else:
        run.concurrency_key = concurrency_key
        with transaction.atomic():
            keys.lock(tenant.pk, concurrency_key)
            # A retry of this request that passed the lookup above while the first was being
            # written finds its run now, under the key's lock, before a policy such as
            # cancel_running could take that run for the key's holder.
            if idempotency_key is not None:
                existing = _existing(tenant, idempotency_key, digest)
                if existing is not None:
                    return Submitted(run=existing, created=False)
            behind = _take_key(tenant, concurrency_key, on_conflict=on_conflict, actor=actor)
            # A key's runs run in the order they took its lock: their submission order.
            run.created_at = run.updated_at = timezone.now()
            if behind is not None:
                run.status = RunStatus.WAITING  # held: its key's runs before it end first
                payload |= {"reason": "concurrency_key", "key": concurrency_key}
                payload |= {"behind": str(behind)} if behind != _NOBODY else {}
            inserted = _insert(run, offload, actor=actor, payload=payload)
            if inserted and behind == _NOBODY:
                keys.release_after_commit(tenant.pk, concurrency_key)
    if not inserted:
        # The idempotency key was taken meanwhile (a concurrent submit of the same request).
        existing = (
            _existing(tenant, idempotency_key, digest) if idempotency_key is not None else None
        )
        if existing is None:
            raise IntegrityError(f"run {run.pk} could not be inserted")
        return Submitted(run=existing, created=False)
    if run.status == RunStatus.QUEUED:
        count_and_notify_after_commit(tenant_id=tenant.pk, queue=queue)
    return Submitted(run=run, created=True)


def validated_input(kind: str, input: Any) -> tuple[Any, Any]:
    """The registered kind and ``input`` normalised by its schema; UnknownKind, or InvalidRunInput (422)."""
    agent_kind = get_kind(kind)
    if agent_kind is None:
        raise unknown_kind(kind)
    try:
        return agent_kind, agent_kind.validate_input(input)
    except InvalidAgentInput as exc:
        raise InvalidRunInput(str(exc), exc.errors) from None


# A held run behind no active one (its key's earlier runs are all held too): the release queues it.
_NOBODY = "nobody"


def _take_key(tenant: Tenant, key: str, *, on_conflict: str, actor: Actor) -> Any:
    """Under the key's lock (taken by the caller, held until the submit commits): None when the
    new run may be queued now, else what it is held behind (the active run's id, or ``_NOBODY``);
    ``reject`` raises instead."""
    live = keys.live_runs(tenant.pk, key)
    if not live:
        return None
    if on_conflict == "reject":
        holder = next((r for r in live if not r.held), live[0])
        raise keys.ConcurrencyKeyTaken(
            f"concurrency key {key!r} is held by run {holder.id} ({holder.status}); "
            "on_conflict=reject starts no other run while it is live",
            run_id=holder.id,
        )
    if on_conflict in ("cancel_running", "cancel_running_with_rollback"):
        from runs.control import cancel_run  # control submits through this module

        for earlier in reversed(live):  # the held ones first, so that none is released meanwhile
            try:
                with transaction.atomic():
                    cancel_run(
                        run=Run(pk=earlier.id),
                        actor=actor,
                        compensate=on_conflict == "cancel_running_with_rollback",
                    )
            except InvalidTransition:
                pass  # it ended meanwhile
        live = keys.live_runs(tenant.pk, key)
        if not live:
            return None
    active = next((r for r in live if not r.held), None)
    return active.id if active is not None else _NOBODY


def _insert(
    run: Run, offload: payloads.Offload | None, *, actor: Actor, payload: dict[str, Any]
) -> bool:
    if offload is None:
        return _insert_queued(run, actor=actor, payload=payload)
    return _insert_queued_with_input(run, offload, actor=actor, payload=payload)


# Each field with its column (a concrete field is one that has a column).
_INSERT_FIELDS = [
    (field, field.column)
    for field in Run._meta.local_concrete_fields
    if not field.generated and field.column is not None
]


def _insert_queued(run: Run, *, actor: Actor, payload: dict[str, Any]) -> bool:
    """Insert ``run`` (``last_event_seq = 1``) with its run.queued Event; False when a unique key was taken.

    What ``save()`` would write for the row (``insert_queued_run``): every
    concrete field but generated ones, ``pre_save`` applied,
    ``get_db_prep_save`` for the value, each a parameter named after its
    column; ``run_after`` left to its ``db_default`` is None there, and the
    database's now that the statement puts instead is read back into ``run``.
    Not Django's insert compiler, which spent half of a submit's CPU
    assembling the same statement again every time.
    """
    db = connections[
        DEFAULT_DB_ALIAS
    ]  # the connection itself: the proxy looks it up on every attribute
    params: dict[str, Any] = {}
    for field, column in _INSERT_FIELDS:
        value = field.pre_save(run, True)
        params[column] = (
            None
            if isinstance(value, DatabaseDefault)
            else field.get_db_prep_save(value, connection=db)
        )
    params |= {
        "actor_type": actor.type,
        "actor_id": actor.id,
        "payload": dumps(payload),
        "event_type": f"run.{run.status}",  # run.queued, or run.waiting for a held turn
    }
    with connection.cursor() as cursor:
        cursor.execute(queries.insert_queued_run, params)
        row = one(cursor)
    if row is None:
        return False
    run.run_after = row["run_after"]
    run._state.adding = False
    run._state.db = connection.alias
    return True


class _KeyTaken(Exception):
    pass


def _insert_queued_with_input(
    run: Run, offload: payloads.Offload, *, actor: Actor, payload: dict[str, Any]
) -> bool:
    """``_insert_queued`` of a run whose input is stored as an Artifact (``runs.payloads``).

    The file is written first, outside any transaction; the Artifact row
    and the run then commit together (the row's foreign key to the run is
    checked at commit), or neither does and the file is deleted.
    """
    file = offload.write_file(run_id=run.pk)
    try:
        with transaction.atomic():
            run.input = offload.save_row(run_id=run.pk, file=file)
            if not _insert_queued(run, actor=actor, payload=payload):
                raise _KeyTaken
    except BaseException as exc:
        offload.discard(file)
        if isinstance(exc, _KeyTaken):
            return False
        raise
    return True


QUEUE_FULL_RETRY_AFTER_SECONDS = 5


def spawn_child(
    *,
    parent_id: Any,
    kind: str,
    input: Any,
    key: str,
    budget_left_cents: Decimal | None,
    queue: str | None = None,
    priority: int | None = None,
) -> Submitted:
    """Create (or find again, by ``key``) a child run of ``parent_id``: its tenant, inside its budget.

    The child's idempotency key is derived from the parent and ``key``, so
    that a spawn step executed again after a crash finds the child it made.
    Its cost ceiling is its own (kind or tenant default), cut to what the
    parent has left; its cost counts toward the parent's ceiling when it
    finishes (``runs.engine.family``).
    """
    parent = Run.objects.select_related("tenant").get(pk=parent_id)
    agent_kind = get_kind(kind)
    ceiling: Decimal | float | None = None
    if agent_kind is not None:
        ceiling = agent_kind.cost_ceiling_cents
    if ceiling is None:
        ceiling = parent.tenant.default_cost_ceiling_cents
    if budget_left_cents is not None:
        ceiling = (
            budget_left_cents if ceiling is None else min(Decimal(str(ceiling)), budget_left_cents)
        )
    return submit(
        tenant=parent.tenant,
        kind=kind,
        input=input,
        queue=queue,
        priority=priority,
        idempotency_key=f"child:{parent.pk}:{key}"[:255],
        cost_ceiling_cents=ceiling,
        actor=Actor(type="system", id=f"parent:{parent.pk}"),
        parent=parent,
    )


def _check_text(**fields: Any) -> None:
    """Client text PostgreSQL cannot store (NUL, lone surrogates, NaN, deep nesting) is a 422 naming the field."""
    for name, value in fields.items():
        if value is not None and (problem := find_unstorable(value, where=name)):
            raise InvalidRunInput(problem)


def known_queues() -> set[str]:
    """Queues a run may be submitted to: kinds' default queues, RUNS_QUEUES, and operator-made queues."""
    from runs.models import Queue

    names = {kind.queue for kind in all_kinds()} | set(settings.RUNS_QUEUES) | declared_queues()
    return names | set(Queue.objects.values_list("name", flat=True))


def check_queue_room(tenant: Tenant, *, fresh: bool = False) -> None:
    """Backpressure: 429 when the tenant already has max_queued runs waiting (its approximate counter).

    With ``fresh`` the counter is the one ``tenant`` was read with (moments ago, in this request).
    """
    if fresh:
        queued, max_queued = tenant.queued, tenant.max_queued
    else:
        with connection.cursor() as cursor:
            cursor.execute(queries.queue_room, {"tenant": tenant.pk})
            row = one(cursor)
        if row is None:
            raise Tenant.DoesNotExist(f"tenant {tenant.pk} does not exist")
        queued, max_queued = row["queued"], row["max_queued"]
    # Submits of this process still waiting in the debounced counter update count too.
    queued += uncounted_submits(tenant.pk)
    if queued >= max_queued:
        raise QueueFull(
            f"the tenant's queue is full ({queued} runs waiting, limit {max_queued}); retry later",
            retry_after=QUEUE_FULL_RETRY_AFTER_SECONDS,
        )


def _existing(tenant: Tenant, key: str, digest: str) -> Run | None:
    run = Run.objects.filter(tenant=tenant, idempotency_key=key).first()
    if run is not None and run.request_hash != digest:
        raise IdempotencyConflict(
            f"idempotency key {key!r} was already used with a different request (run {run.id})"
        )
    return run
