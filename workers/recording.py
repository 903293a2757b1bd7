"""The machinery under ``RunContext.step``: bounds checked before a step, the step's thread and timeout,
and what is recorded when it is slow, writes ahead, fails or was interrupted.

``StepMachinery`` is RunContext's base class; agent code never uses it directly.
"""

from __future__ import annotations

import contextvars
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DataError, IntegrityError

from runs.db import dumps, release_connection
from runs.engine import marks
from runs.engine import steps as checkpoint
from workers.classify import classify
from workers.errors import (
    Ambiguous,
    Fatal,
    LeaseLost,
    ParkForHuman,
    ReleaseRun,
    ReplayEnded,
    Retryable,
    StepError,
    StepTimeout,
    StopRun,
)
from workers.step_support import Host, RunControl, StepFailure, StepThread

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.registry import AgentKind

logger = logging.getLogger(__name__)

# A step still running after this long is written as the run's current step.
ANNOUNCE_AFTER_SECONDS = 0.2
# How long a run keeps the pooled connection of its last checkpoint while
# its next step runs, so that a no-op step's checkpoint reuses it. A step
# still running after this hands it back: the pool has a dozen connections
# and a worker hundreds of runs, and keeping it until the announcement
# (0.2 s) capped a worker at pool size / 0.2 s = 60 slow steps started per
# second (bench/inflight.py).
KEEP_CONNECTION_SECONDS = 0.002

# Errors of a statement whose values the database refused (a constraint, a
# value out of range): not the engine hiccupping, and the same write would be
# refused again. A lost connection or a deadlock is not among them.
REFUSED = (IntegrityError, DataError)

# The run whose kind code is executing in this context between its steps (set by the executor around
# the agent function), None inside a step and outside any run: workers.context.current_run().
BETWEEN_STEPS: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "agentruns_between_steps", default=None
)


@dataclass(frozen=True)
class Compensator:
    """A finished step's compensation, learnt when the step ran or was replayed."""

    seq: int
    name: str
    fn: Callable[..., Any]
    output: Any
    key: str  # the step's idempotency key, if it had one


class StepMachinery:
    """State and checks shared by every step of one execution of a run (see ``RunContext``)."""

    _claimed: ClaimedRun
    _worker: Host
    _control: RunControl
    _kind: AgentKind
    _model_steps: int
    _steps_total: int | None
    _cost: Decimal
    _claimed_clock: float
    last_failure: StepFailure | None

    run_id: Any  # RunContext's properties
    generation: int
    # A saga's rollback (workers.saga): None, "replay" (replaying to learn the
    # compensations: no step may run) or "compensate" (running them).
    _rollback: str | None = None
    _compensations: dict[int, Compensator]

    def _remember_compensation(self, seq: int, name: str, fn, output: Any, key: str) -> None:
        if fn is not None:
            self._compensations[seq] = Compensator(
                seq=seq, name=name, fn=fn, output=output, key=key
            )

    def _replay_ends_here(self) -> None:
        """While replaying to roll back, the first step that did not finish ends the replay."""
        if self._rollback == "replay":
            raise ReplayEnded("the replay reached a step that did not finish")

    # Bounds and signals.
    def _before_step(self, seq: int, kind: str) -> None:
        """A new step starts only while the run is still ours, wanted, and within its bounds."""
        self._replay_ends_here()
        if self._control.lease_lost.is_set():
            raise LeaseLost("lease lost")
        if not self._worker.lease_is_fresh():
            # Heartbeats have failed for lease - heartbeat seconds: another
            # worker may own the run soon, so start nothing new.
            self._control.lease_lost.set()
            raise LeaseLost("heartbeats failing; not starting a new step")
        if self._rollback == "compensate":
            # A rollback runs to its end: not stopped by the cancel or the
            # bound that started it, only released by a shutdown.
            if self._worker.stopping.is_set():
                raise ReleaseRun("worker shutting down")
            return
        if self._control.cancel_requested.is_set() or self._control.pause_requested.is_set():
            raise ReleaseRun("cancel or pause requested")
        if self._worker.stopping.is_set():
            raise ReleaseRun("worker shutting down")
        if seq > self._kind.max_steps:
            raise StopRun(
                "step_limit", f"the run reached its limit of {self._kind.max_steps} steps"
            )
        if kind == "llm" and self._model_steps > self._kind.max_model_iterations:
            raise StopRun(
                "step_limit",
                f"the run reached its limit of {self._kind.max_model_iterations} model calls",
            )
        if self._deadline_left() <= 0:
            raise StopRun("deadline", self._deadline_message())
        self._check_budget()

    def _check_budget(self) -> None:
        if self._rollback:
            return  # compensations run even when the money ran out
        ceiling = self._claimed.cost_ceiling_cents
        if ceiling is not None and self._cost > ceiling:
            raise StopRun(
                "budget", f"the run cost {self._cost:.6f}¢, over its ceiling of {ceiling}¢"
            )

    def _deadline_left(self) -> float:
        used = self._claimed.running_seconds + (time.monotonic() - self._claimed_clock)
        return self._claimed.deadline_seconds - used

    def _deadline_message(self) -> str:
        return f"the run used its {self._claimed.deadline_seconds} s of running time (deadline)"

    def _timeout(self, requested: float | None) -> float:
        timeout = requested or self._kind.step_timeout or settings.RUNS_STEP_TIMEOUT_SECONDS
        return max(0.001, min(timeout, self._deadline_left()))

    def _note_flags(self, cancel: bool, pause: bool) -> None:
        self._control.note(cancel=cancel, pause=pause)

    # Executing one step.
    def _call(self, fn, args, kwargs, record: checkpoint.StepRecord, timeout: float) -> Any:
        """Run ``fn`` on the step thread; announce it when slow; give up on it after ``timeout``."""
        runner = StepThread.for_this_thread()
        started = time.monotonic()
        # In a copy of this thread's context: the step's log lines carry the run's fields, its spans nest
        # under the step's (workers.tracing).
        step_context = contextvars.copy_context()
        step_context.run(BETWEEN_STEPS.set, None)  # inside a step: the step records what happens
        box, finished = runner.submit(step_context.run, (fn, *args), kwargs)
        if not finished.wait(min(KEEP_CONNECTION_SECONDS, timeout)):
            release_connection()  # a run waiting on its step holds no connection
        if not finished.wait(
            max(0.0, min(ANNOUNCE_AFTER_SECONDS, timeout) - (time.monotonic() - started))
        ):
            self._announce(record)
            if not finished.wait(max(0.0, timeout - (time.monotonic() - started))):
                StepThread.abandon_this_thread()  # the next step gets a fresh thread
                self._worker.watch_stuck_step(runner.thread, timeout)
                raise StepTimeout(f"step {record.name!r} did not return within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _announce(self, record: checkpoint.StepRecord) -> None:
        try:
            flags = marks.announce_step(
                run_id=self.run_id,
                token=self._claimed.lease_token,
                seq=record.seq,
                name=record.name,
                kind=record.kind,
                steps_total=self._steps_total,
                worker_id=self._worker.id,
            )
        finally:
            release_connection()
        if flags is None:
            self._control.lease_lost.set()  # the step's checkpoint will find out too
        else:
            self._note_flags(*flags)

    def _write_ahead(self, record: checkpoint.StepRecord) -> None:
        try:
            written = marks.begin_side_effect(
                record, steps_total=self._steps_total, worker_id=self._worker.id
            )
        except REFUSED as exc:
            # Nothing ran: the run fails now rather than being retried into the same refusal.
            error = Fatal(
                f"step {record.name!r} could not be written ahead of its side effect, so it did not run: "
                f"{type(exc).__name__}: {exc}"
            )
            self._failure_refused_too(record, error)
            raise error from exc
        finally:
            release_connection()
        if not written:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost before the side effect of step {record.seq}")

    def _step_failed(
        self, record: checkpoint.StepRecord, exc: BaseException, *, uncertain_means_ambiguous: bool
    ) -> None:
        found = classify(exc)
        error_kind = found.kind
        if uncertain_means_ambiguous and found.kind == "retryable" and found.uncertain:
            error_kind = "ambiguous"
        usage = getattr(exc, "usage", None)
        if usage:
            record.tokens_in, record.tokens_out = usage[0], usage[1]
            record.cost_cents = Decimal(str(usage[2]))
        self._record(
            record, exc, error_kind, status="waiting" if error_kind == "ambiguous" else "failed"
        )
        self.last_failure = StepFailure(exc, error_kind, found.retry_after, record.seq, record.name)
        # Money a failed call cost counts against the ceiling too: a bound, not a retry.
        self._check_budget()

    def _checkpoint_refused(
        self,
        record: checkpoint.StepRecord,
        exc: BaseException,
        *,
        side_effect: bool,
        key: str | None,
    ) -> None:
        """The step ran but the database refused its checkpoint: never run it again unasked.

        Its output stays unrecorded. A keyed side effect is retried with its
        key (bounded by the retry budget); an unkeyed one waits for a person,
        who knows whether the effect happened; any other step fails the run.
        """
        what = f"the checkpoint of step {record.seq} ({record.name}) was refused: {type(exc).__name__}: {exc}"
        # What the call cost is kept with the failure, as with any failed execution.
        usage = {
            "tokens_in": record.tokens_in,
            "tokens_out": record.tokens_out,
            "cost_cents": record.cost_cents,
        }
        error: StepError
        if side_effect and key:
            error = Retryable(
                f"{what}; the side effect is retried with its idempotency key", **usage
            )
        elif side_effect:
            error = Ambiguous(
                f"{what}; the side effect has no idempotency key, so a person decides", **usage
            )
        else:
            error = Fatal(what, **usage)
        self._failure_refused_too(record, error)
        raise error from exc

    def _failure_refused_too(self, record: checkpoint.StepRecord, error: StepError) -> None:
        """Record ``error`` as the step's failure; if that write is refused too, the run's error alone tells it."""
        try:
            self._step_failed(record, error, uncertain_means_ambiguous=False)
        except REFUSED:
            release_connection()
            logger.warning(
                "could not record the failure of step %s (%s)",
                record.seq,
                record.name,
                exc_info=True,
            )
            self.last_failure = StepFailure(error, error.error_kind, None, record.seq, record.name)

    def _park_unknown_outcome(self, seq: int, name: str, kind: str, args, kwargs) -> None:
        message = (
            f"step {seq} ({name}) was interrupted after its side effect began and has no idempotency key: "
            "the effect may or may not have happened, so a person decides"
        )
        record = checkpoint.StepRecord(
            run_id=self.run_id,
            token=self._claimed.lease_token,
            generation=self._claimed.generation,
            seq=seq,
            name=name,
            kind=kind,
            input=describe_args(args, kwargs),
            started_at=datetime.now(UTC),
        )
        self._record(record, None, "ambiguous", status="waiting", error=message)
        raise ParkForHuman(message)

    def _record(
        self, record, exc: BaseException | None, error_kind: str, *, status: str, error: str = ""
    ) -> None:
        try:
            cost = checkpoint.record_step_failure(
                record,
                error=error or _format_error(exc),
                error_kind=error_kind,
                worker_id=self._worker.id,
                status=status,
            )
        finally:
            release_connection()
        if cost is None:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost while recording the failure of step {record.seq}")
        self._cost = cost

    def _step_idempotency_key(self, seq: int, requested: str | bool | None) -> str | None:
        if requested is True:
            return f"{self.run_id}:{self.generation}:{seq}"
        if isinstance(requested, str) and requested:
            return requested
        return None


def describe_args(args: tuple, kwargs: dict) -> Any:
    """The step input for the audit trail: the arguments when they are JSON, else their repr."""
    payload: dict[str, Any] = {}
    if args:
        payload["args"] = list(args)
    if kwargs:
        payload["kwargs"] = kwargs
    if not payload:
        return None
    try:
        dumps(payload)
        return payload
    except (TypeError, ValueError):
        return {"repr": repr(payload)[:2000]}


def _format_error(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = "".join(traceback.format_exception(exc))
    return f"{type(exc).__name__}: {exc}\n\n{text[-8000:]}"
