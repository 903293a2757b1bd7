"""The one exit from running (docs/architecture.md: the state machine).

Every path out of ``running`` (finish, fail, retry, park, graceful release,
lease rescue by the reaper, an operator's requeue) is an ``Exit``, written
by one statement (``runs/sql/exit.sql``, ``leave_running``) which clears
the lease, gives the tenant slot back, adds the running time, writes the
Event, and honours a cancel or pause request that landed meanwhile: a run
being parked is cancelled or paused instead. A retry that would spend the
last attempt fails the run. What the exit asks for is its ``target``; the
status it reached comes back as ``Exited.status``, decided by the statement
under the row lock, so that a cancel or a pause wins atomically.

A worker may defer giving the slot back (``give_slot=False``) to its next
claim, which gives back the slots of all the runs it finished since in one
write of each tenant row, instead of one write per exit on a row every
exit of a busy tenant would queue for. The exit's time, returned here, is
what the claim checks against the tenant's last reconciliation, so that the
reaper and the claim never both give back the same slot.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple
from uuid import UUID

from django.conf import settings
from django.db import transaction

from runs.db import engine_cursor, storable_text
from runs.engine import keys, recordset
from runs.engine.family import child_finished
from runs.engine.limits_seen import limits_seen
from runs.engine.turns import lock_thread_of, tell_turn_ended
from runs.events import Actor
from runs.metrics import process as metrics
from runs.queries import queries, rows
from runs.states import TERMINAL_STATUSES, RunOutcome, RunStatus
from runs.titles import SUMMARY_MAX, one_line

logger = logging.getLogger(__name__)

# What an exit may ask for: paused is only ever reached (a pause request
# wins over a release), and running is where it leaves from.
_TARGETS = frozenset(RunStatus) - {RunStatus.RUNNING, RunStatus.PAUSED}


@recordset.row_of(queries.leave_running)
@dataclass(frozen=True, kw_only=True)
class Exit(recordset.Row):
    """How a run leaves running: one row of the exit statement, built by a named constructor.

    ``Exit.done(result=...)``, ``Exit.fail(...)``, ``Exit.retry(...)``,
    ``Exit.release(...)``, ``Exit.sleep(...)``, ``Exit.await_capacity(...)``, ``Exit.await_human(...)``,
    ``Exit.await_message(...)``, ``Exit.await_children(...)``,
    ``Exit.rolled_back(...)``, ``Exit.rescue(...)``; then ``of_run()`` says
    whose exit it is, and ``reporting()`` adds what the agent reported. A
    combination the statement cannot mean is refused (ValueError) however
    the value is made.

    Its fields up to ``only_if_expired`` are the columns of ``p`` in
    ``runs/sql/exit.sql`` (``leave_running``), in their order and of their
    types (checked at import, ``recordset.row_of``). The last two are
    Python's: the run's ``parent`` and the metrics' name of a retry's error.
    """

    run: UUID | None = None
    token: int | None = None
    target: RunStatus  # what the exit asks for
    reason: str
    result: str | None = None  # a done run's result, JSON text already storable
    error: str | None = None  # untrusted text, made storable here; None keeps the run's error
    error_kind: str | None = None
    add_failure: bool = False  # a failed attempt: it counts against max_attempts
    delay: float = 0.0  # seconds before a run back in the queue may be claimed
    wake_at: datetime | None = None  # when a sleep ends, or a parked run's timer
    # Parking, re-checked under the row lock.
    wake_on_message: bool = False
    wake_on_children: bool = False
    compensation: str | None = None  # the rollback state, set with the exit
    # What the agent reported (ctx.report).
    outcome: str | None = None
    summary: str | None = None
    actor_type: str | None = None
    actor_id: str | None = None
    give_slot: bool = False  # False: the worker's next claim gives the tenant slot back
    only_if_expired: bool = False  # the reaper's rescue: only while the lease is still expired
    parent: UUID | None = field(default=None, metadata=recordset.PYTHON_ONLY)
    thread: UUID | None = field(default=None, metadata=recordset.PYTHON_ONLY)
    error_class: str | None = field(default=None, metadata=recordset.PYTHON_ONLY)

    def __post_init__(self) -> None:
        target = self.target
        if not isinstance(target, RunStatus):  # the constructors below give the enum already
            target = RunStatus(target)
            object.__setattr__(self, "target", target)
        if target not in _TARGETS:
            raise ValueError(f"a run cannot leave running for {target}")
        if (self.result is not None) != (target == RunStatus.DONE):
            raise ValueError("a run that is done has a result, and only that one")
        queued = target == RunStatus.QUEUED
        if self.add_failure and not queued:
            raise ValueError("only a retry counts a failed attempt")
        if self.delay < 0 or (self.delay and not queued):
            raise ValueError("only a run going back to the queue waits, and never a negative time")
        if self.wake_at is not None and target not in (RunStatus.QUEUED, RunStatus.WAITING):
            raise ValueError("only a sleeping or waiting run has a time to wake")
        if self.wake_on_message and self.wake_on_children:
            raise ValueError("a run waits for a message or for children, not both")
        if (self.wake_on_message or self.wake_on_children) and target != RunStatus.WAITING:
            raise ValueError("only a waiting run waits for a message or children")
        if self.compensation is not None and target not in (
            RunStatus.FAILED,
            RunStatus.CANCELLED,
        ):
            raise ValueError("a rollback ends the run failed or cancelled")
        if self.outcome is not None and self.outcome not in RunOutcome.values:
            raise ValueError(f"unknown outcome {self.outcome!r}; use one of {RunOutcome.values}")
        if self.error is not None:
            object.__setattr__(self, "error", storable_text(self.error))
        if self.summary is not None:
            object.__setattr__(self, "summary", one_line(self.summary, limit=SUMMARY_MAX))

    # What a run's execution asks for.
    @classmethod
    def done(cls, *, result: str, reason: str = "finished") -> Exit:
        """The agent returned ``result`` (JSON text, already storable)."""
        return cls(target=RunStatus.DONE, reason=reason, result=result)

    @classmethod
    def fail(cls, *, reason: str, error: str, error_kind: str) -> Exit:
        """Failed for good: a fatal error, or a bound (``error_kind`` says which)."""
        if error_kind in ("", "retryable", "ambiguous"):
            raise ValueError(
                f"a run fails for good on a fatal error or a bound, not {error_kind!r}: "
                "a retryable error is Exit.retry, an ambiguous one Exit.await_human"
            )
        return cls(target=RunStatus.FAILED, reason=reason, error=error, error_kind=error_kind)

    @classmethod
    def retry(
        cls,
        *,
        error: str,
        delay: float,
        error_class: str,
        reason: str = "retry",
    ) -> Exit:
        """A failed attempt: back to the queue after ``delay`` seconds, or failed once the budget is spent."""
        return cls(
            target=RunStatus.QUEUED,
            reason=reason,
            error=error,
            error_kind="retryable",
            add_failure=True,
            delay=delay,
            error_class=error_class,
        )

    @classmethod
    def release(cls, *, reason: str, delay: float = 0.0, error: str | None = None) -> Exit:
        """Back to the queue spending nothing (a shutdown, a cancel or pause to honour, a lost connection)."""
        return cls(target=RunStatus.QUEUED, reason=reason, error=error, delay=delay)

    @classmethod
    def sleep(cls, *, until: datetime) -> Exit:
        """A durable sleep: queued, claimable at ``until``."""
        return cls(target=RunStatus.QUEUED, reason="sleep", wake_at=until)

    @classmethod
    def await_capacity(cls, *, until: datetime) -> Exit:
        """A shared rate limit has no room: queued, claimable at ``until``, spending nothing."""
        return cls(target=RunStatus.QUEUED, reason="rate_limited", wake_at=until)

    @classmethod
    def await_human(cls, *, reason: str, error: str = "", error_kind: str = "") -> Exit:
        """A person decides next (an approval, an ambiguous side effect, a compensation that failed)."""
        return cls(
            target=RunStatus.WAITING_HUMAN, reason=reason, error=error, error_kind=error_kind
        )

    @classmethod
    def await_message(cls, *, wake_at: datetime | None = None) -> Exit:
        """Parked until a message arrives (or ``wake_at``); one already there queues the run at once."""
        return cls(
            target=RunStatus.WAITING,
            reason="message",
            error="",
            error_kind="",
            wake_on_message=True,
            wake_at=wake_at,
        )

    @classmethod
    def await_children(cls, *, wake_at: datetime | None = None) -> Exit:
        """Parked until enough children finished (or ``wake_at``); if they have, queued at once."""
        return cls(
            target=RunStatus.WAITING,
            reason="children",
            error="",
            error_kind="",
            wake_on_children=True,
            wake_at=wake_at,
        )

    @classmethod
    def rolled_back(
        cls,
        target: RunStatus,
        *,
        compensation: str,
        error: str | None = None,
        error_kind: str | None = None,
        reason: str = "compensated",
    ) -> Exit:
        """A rollback ended: the run ends ``target`` (failed or cancelled) with its rollback state."""
        return cls(
            target=target,
            reason=reason,
            error=error,
            error_kind=error_kind,
            compensation=compensation,
        )

    @classmethod
    def rescue(
        cls,
        *,
        reason: str,
        error: str,
        actor_type: str = "system",
        actor_id: str = "reaper",
    ) -> Exit:
        """The reaper's: a run whose lease expired is a failed attempt, fenced on that lease still expired."""
        return cls(
            target=RunStatus.QUEUED,
            reason=reason,
            error=error,
            add_failure=True,
            only_if_expired=True,
            actor_type=actor_type,
            actor_id=actor_id,
            error_class="LeaseExpired",
        )

    # Whose exit it is.
    def of_run(
        self,
        run: UUID,
        token: int,
        *,
        parent: UUID | None = None,
        thread: UUID | None = None,
        actor_type: str | None = None,
        actor_id: str | None = None,
        give_slot: bool = True,
    ) -> Exit:
        """This exit for run ``run`` under lease ``token``, by a worker unless the exit says otherwise.

        ``parent`` is the run's parent, for a child run; ``thread`` its
        thread, for a turn of a conversation.
        """
        return dataclasses.replace(
            self,
            run=run,
            token=token,
            parent=parent,
            thread=thread,
            actor_type=actor_type or self.actor_type or "worker",
            actor_id=actor_id if actor_id is not None else (self.actor_id or ""),
            give_slot=give_slot,
        )

    def reporting(self, outcome: str | None, summary: str | None) -> Exit:
        """With what the agent reported (``ctx.report``): stored, and told in the Event, if this exit ends the run.

        An exit that ends the run without it clears any earlier report. The
        summary is untrusted text, made one bounded line; an unknown outcome
        is a ValueError.
        """
        return dataclasses.replace(self, outcome=outcome, summary=summary)

    @property
    def batchable(self) -> bool:
        """Whether it can be written with other runs' exits in one statement (``leave_many``).

        A child's exit tells its parent in the same transaction, a turn's
        exit takes its thread's lock first and tells the thread, and parking
        for a message or children takes the row lock before it decides.
        """
        return (
            self.parent is None
            and self.thread is None
            and not (self.wake_on_message or self.wake_on_children)
        )


class Exited(NamedTuple):
    status: RunStatus  # the status reached
    queue: str
    at: datetime  # when (the database's clock)
    parent_id: UUID | None = None
    kind: str = ""
    thread_id: UUID | None = None
    woke_parent: str | None = None  # the queue of a parent this exit woke: wake its workers
    tenant_id: UUID | None = None
    concurrency_key: str | None = (
        None  # a run of a key that ends lets the next one go (runs.engine.keys)
    )

    @property
    def leaves_orphans(self) -> bool:
        """It failed or was cancelled: its live children, if any, are to be cancelled (runs.control)."""
        return self.status in (RunStatus.FAILED, RunStatus.CANCELLED)


def leave(exit: Exit, *, expires_seconds: float | None = None) -> Exited | None:
    """Move a run out of ``running`` as ``exit`` asks; see the module's docstring.

    Returns the status actually reached, the run's queue and the exit's
    time, or None when the guard did not match (the lease is not the
    exit's token's any more, or for a rescue the lease has not expired):
    then nothing changed. A child's exit (``exit.parent``) wakes its parent
    in the same transaction (``runs.engine.family``); parking for a message
    or for children re-checks under the row lock. ``expires_seconds``: how
    long a parked run may wait for people (``RUNS_EXPIRES_SECONDS``).
    """
    if exit.run is None or exit.token is None:
        raise ValueError("an exit names its run and lease (Exit.of_run)")
    expires = settings.RUNS_EXPIRES_SECONDS if expires_seconds is None else expires_seconds
    recheck = exit.wake_on_message or exit.wake_on_children
    if not recheck and exit.parent is None and exit.thread is None:
        exited = _execute([exit], expires=expires)[0]
        if exited is None or exited.status not in TERMINAL_STATUSES:
            return exited
        if exited.parent_id is None and exited.thread_id is None:
            return exited
        # Not expected (a child's exit names its parent, a turn's its thread): tell them now, late
        # but not lost.
        logger.warning(
            "run %s left running without naming its parent %s or thread %s",
            exit.run,
            exited.parent_id,
            exited.thread_id,
        )
        with transaction.atomic():
            return _after_end(exited, exit)
    with transaction.atomic():
        if exit.thread is not None:
            lock_thread_of(exit.run)  # before the run's row: the lock order of conversations
        if recheck:
            with engine_cursor() as cursor:
                cursor.execute(queries.lock_run_to_recheck, {"run": exit.run})
        exited = _execute([exit], expires=expires)[0]
        if exited is not None and exited.status in TERMINAL_STATUSES:
            exited = _after_end(exited, exit)
        return exited


def _after_end(exited: Exited, exit: Exit) -> Exited:
    """A terminal exit tells the run's parent (a child) and its thread (a turn), in its transaction."""
    assert exit.run is not None
    if exited.thread_id is not None:
        lock_thread_of(exit.run)  # held already, unless the exit did not name its thread
        tell_turn_ended(
            exit.run, actor=Actor(type=exit.actor_type or "worker", id=exit.actor_id or "")
        )
    if exited.parent_id is not None:
        exited = exited._replace(woke_parent=_tell_parent(exited, exit.run, exited.parent_id))
    return exited


def leave_many(exits: Sequence[Exit]) -> list[Exited | None]:
    """Several runs leave running in one statement, each as ``leave`` would make it leave.

    For batchable exits (``Exit.batchable``) of different runs. The answers
    are in the exits' order, None where the guard did not match.
    """
    if len({exit.run for exit in exits}) != len(exits):
        raise ValueError("leave_many takes one exit per run")
    if not all(exit.batchable for exit in exits):
        raise ValueError("a child's exit, and one that re-checks its wake-up, is written alone")
    return _execute(exits, expires=settings.RUNS_EXPIRES_SECONDS)


def _execute(exits: Sequence[Exit], *, expires: float) -> list[Exited | None]:
    params: dict[str, Any] = {
        "rows": recordset.rows(exits),
        "run": [exit.run for exit in exits],
        "expires": float(expires),
        "running": RunStatus.RUNNING.value,
    }
    # The runs whose tenant's counters the exit may write: a slot given back, or a run that
    # may go back to the queue (a retry, or a wait that a message or a cancel turns into one).
    counted = [exit.run for exit in exits if exit.give_slot or exit.target not in TERMINAL_STATUSES]
    with engine_cursor() as cursor:
        limited = limits_seen.in_force(cursor)
        prelock = bool(counted) or limited
        with transaction.atomic(savepoint=False) if prelock else nullcontext():
            if prelock:
                cursor.execute(
                    queries.lock_before_exit,
                    {"runs": params["run"], "counted": counted, "limited": limited},
                )
            cursor.execute(
                queries.leave_running_limited if limited else queries.leave_running, params
            )
            found = {
                row["id"]: Exited(
                    status=RunStatus(row["status"]),
                    queue=row["queue"],
                    at=row["at"],
                    parent_id=row["parent_id"],
                    kind=row["kind"],
                    thread_id=row["thread_id"],
                    tenant_id=row["tenant_id"],
                    concurrency_key=row["concurrency_key"],
                )
                for row in rows(cursor)
            }
    answers = [found.get(exit.run) for exit in exits]
    for exit, exited in zip(exits, answers, strict=True):
        _after_commit(exited, exit)
    return answers


def _after_commit(exited: Exited | None, exit: Exit) -> None:
    """Once the exit commits: it counts in this process's metrics (runs.metrics), and a run of a
    concurrency key that ended lets the key's next run go (runs.engine.keys)."""
    if exited is None:
        return
    if exited.status in TERMINAL_STATUSES:
        transaction.on_commit(
            lambda: metrics.run_finished(queue=exited.queue, kind=exited.kind, status=exited.status)
        )
        if exited.concurrency_key is not None:
            keys.release_after_commit(exited.tenant_id, exited.concurrency_key)
    elif exit.add_failure and exited.status == RunStatus.QUEUED:
        error_class = exit.error_class or exit.reason
        transaction.on_commit(lambda: metrics.retried(kind=exited.kind, error_class=error_class))


def _tell_parent(exited: Exited, run_id: UUID, parent_id: UUID) -> str | None:
    return child_finished(
        child_id=run_id, parent_id=parent_id, succeeded=exited.status == RunStatus.DONE
    )
