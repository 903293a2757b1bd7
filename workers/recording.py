"""Executing and recording one step: the checkpoint of what it returned, or the failure it raised.

``StepRecorder.execute`` runs a durable operation's function at the step
log's position: on replay a finished step's recorded output is returned; a
step written ahead of a side effect whose outcome nobody recorded waits for
a person; otherwise the step's bounds are checked (``workers.bounds``), a
``side_effect=True`` step is written ahead (``runs.engine.marks``), the
function runs on its step thread under its timeout (``workers.step_thread``),
a slow step is announced, and its output is checkpointed
(``runs.engine.steps``, with the worker's other runs' by
``workers.committer``) or its failure recorded as an attempt of the step.
``RunContext`` is its one user; agent code never uses it directly.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.db import DataError, IntegrityError

from runs.db import dumps, release_connection
from runs.engine import marks
from runs.engine import steps as checkpoint
from runs.engine.steplog import RecordedStep
from runs.exceptions import PayloadTooLarge
from runs.metrics import process as metrics
from workers.classify import classify
from workers.errors import (
    Ambiguous,
    Fatal,
    ParkForHuman,
    Retryable,
    RunSignal,
    StepError,
    StopRun,
)
from workers.step_thread import call_step
from workers.tracing import observed_step
from workers.values import StepResult

if TYPE_CHECKING:
    from uuid import UUID

    from workers.bounds import RunBounds
    from workers.steplog import Position, StepLog

logger = logging.getLogger(__name__)

# Errors of a statement whose values the database refused (a constraint, a
# value out of range): not the engine hiccupping, and the same write would be
# refused again. A lost connection or a deadlock is not among them.
REFUSED = (IntegrityError, DataError)

# Steps written as `waiting` while the run sleeps or waits (not ahead of a side effect).
WAITING_KINDS = frozenset({"sleep", "message", "child"})


@dataclass(frozen=True)
class Compensator:
    """A finished step's compensation, learnt when the step ran or was replayed."""

    seq: int
    name: str
    fn: Callable[..., Any]
    output: Any
    key: str  # the step's idempotency key, if it had one


@dataclass(frozen=True)
class StepFailure:
    """How the executor is to handle an exception a step raised."""

    exc: BaseException
    error_kind: str  # retryable | fatal | ambiguous
    retry_after: float | None
    seq: int
    name: str


class StepRecorder:
    """Executes the steps of one execution of a run and records each outcome (see the module's docstring)."""

    def __init__(self, *, bounds: RunBounds, log: StepLog) -> None:
        self._bounds = bounds
        self._log = log
        self._claimed = bounds.claim
        self._worker = bounds.worker
        self._steps_total: int | None = None
        self._idempotency_key: str | None = None
        self._compensations: dict[int, Compensator] = {}
        self._last_failure: StepFailure | None = None
        self._progressed = False

    @property
    def run_id(self) -> UUID:
        return self._claimed.id

    @property
    def generation(self) -> int:
        return self._claimed.generation

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key of the step being executed (None between steps)."""
        return self._idempotency_key

    @property
    def last_failure(self) -> StepFailure | None:
        """The last failure a step of this execution raised, as it was recorded."""
        return self._last_failure

    @property
    def progressed(self) -> bool:
        """A step completed during this execution (its checkpoint reset the run's failures to 0)."""
        return self._progressed

    @property
    def steps_total(self) -> int | None:
        """The steps the agent said to expect (``ctx.progress(total=)``), written with the next step's record."""
        return self._steps_total

    def expect_steps(self, total: int) -> None:
        self._steps_total = total

    @property
    def compensations(self) -> list[Compensator]:
        """The compensations of the steps this execution ran or replayed, newest first."""
        return sorted(self._compensations.values(), key=lambda c: -c.seq)

    def compensation_of(self, seq: int) -> Compensator | None:
        return self._compensations.get(seq)

    def _remember_compensation(self, seq: int, name: str, fn, output: Any, key: str) -> None:
        if fn is not None:
            self._compensations[seq] = Compensator(
                seq=seq, name=name, fn=fn, output=output, key=key
            )

    def execute(
        self,
        name,
        fn,
        args,
        kwargs,
        *,
        at: Position | None = None,
        side_effect=False,
        idempotency_key=None,
        timeout=None,
        kind="custom",
        consumes_messages=False,
        started_at=None,
        compensate=None,
        input=None,
        compensates=None,
    ) -> Any:
        """Run ``fn`` as step ``name`` at the next position, or at ``at`` (a position already taken)."""
        position = at or self._log.take(name)
        if (
            position.name != name
        ):  # the engine's mistake, not the agent's: the position was checked for another
            raise RuntimeError(f"step {position.seq} was taken for {position.name!r}, not {name!r}")
        seq, recorded = position.seq, position.recorded
        if kind == "llm":
            self._bounds.count_model_call()
        key = self._step_idempotency_key(seq, idempotency_key)
        if recorded is not None:
            if recorded.status in ("done", "compensated"):
                self._remember_compensation(
                    seq, name, compensate, recorded.output, recorded.idempotency_key
                )
                return recorded.output
        self._bounds.replay_ends_here()
        if (
            recorded is not None
            and recorded.status in ("running", "waiting")
            and recorded.kind not in WAITING_KINDS
        ):
            # Written ahead of a side effect whose outcome nobody recorded.
            if not recorded.idempotency_key:
                self._park_unknown_outcome(seq, name, kind, args, kwargs)
            key = recorded.idempotency_key
        self._bounds.before_step(seq, kind)

        record = checkpoint.StepRecord(
            run_id=self.run_id,
            token=self._claimed.lease_token,
            generation=self._claimed.generation,
            seq=seq,
            name=name,
            kind=kind,
            input=describe_args(args, kwargs) if input is None else input,
            started_at=started_at or datetime.now(UTC),
            idempotency_key=key or "",
            compensates=compensates,
        )
        with observed_step(self, record):
            return self._execute_step(
                record,
                fn,
                args,
                kwargs,
                side_effect=side_effect,
                key=key,
                timeout=timeout,
                consumes_messages=consumes_messages,
                compensate=compensate,
            )

    def _execute_step(
        self, record, fn, args, kwargs, *, side_effect, key, timeout, consumes_messages, compensate
    ) -> Any:
        """Execute step ``record``: write it ahead if it has a side effect, call ``fn``, checkpoint its output."""
        seq, name, kind = record.seq, record.name, record.kind
        if side_effect:
            self._write_ahead(record)
        self._idempotency_key = key
        started = time.monotonic()
        try:
            value = self._call(fn, args, kwargs, record, self._bounds.timeout(timeout))
        except RunSignal:
            raise
        except BaseException as exc:  # noqa: BLE001 - a step's SystemExit is its failure too (workers.classify)
            metrics.step_finished(
                kind=self._claimed.kind,
                step_kind=kind,
                status="failed",
                seconds=time.monotonic() - started,
            )
            self._step_failed(record, exc, uncertain_means_ambiguous=side_effect and not key)
            if self._bounds.deadline_left() <= 0:
                raise StopRun("deadline", self._bounds.deadline_message()) from exc
            raise
        finally:
            self._idempotency_key = None

        output = value.output if isinstance(value, StepResult) else value
        if isinstance(value, StepResult):
            record.tokens_in = value.tokens_in
            record.tokens_out = value.tokens_out
            record.cost_cents = Decimal(str(value.cost_cents))
        try:
            answer = self._checkpoint(record, output, consumes_messages)
        except TypeError as exc:  # the output is not JSON: nothing was written
            release_connection()
            error = Fatal(f"step {name!r} returned data that is not JSON-serialisable: {exc}")
            self._step_failed(record, error, uncertain_means_ambiguous=False)
            raise error from None
        except PayloadTooLarge as exc:  # past RUNS_PAYLOAD_MAX_BYTES: nothing was written
            release_connection()
            error = Fatal(str(exc))
            self._step_failed(record, error, uncertain_means_ambiguous=False)
            raise error from None
        except (
            REFUSED
        ) as exc:  # the database refused the record: writing it again would be refused again
            release_connection()
            self._checkpoint_refused(record, exc, side_effect=side_effect, key=key)
        except BaseException:
            release_connection()
            raise
        # A checkpoint written here (not by the committer) keeps the run's
        # connection while it is busy with fast steps; a step not done within
        # KEEP_CONNECTION_SECONDS hands it back (see _call), and so does leaving running.
        if answer is None:
            raise self._bounds.lose_lease(f"lease lost while checkpointing step {seq} ({name})")
        cancel, pause, cost, output_json = answer
        self._bounds.spent(cost)
        metrics.step_finished(
            kind=self._claimed.kind,
            step_kind=kind,
            status="done",
            seconds=time.monotonic() - started,
        )
        self._progressed = True  # the checkpoint reset the run's failures to 0
        self._bounds.note_flags(cancel, pause)
        result = json.loads(output_json)
        self._log.note(
            RecordedStep(
                seq=seq,
                name=name,
                status="done",
                output=result,
                kind=kind,
                idempotency_key=key or "",
            )
        )
        self._remember_compensation(seq, name, compensate, result, key or "")
        self._bounds.check_budget()
        return result

    def _checkpoint(self, record: checkpoint.StepRecord, output: Any, consumes_messages: bool):
        """Commit the finished step (workers.committer); raises TypeError when its output is not JSON."""
        return self._worker.committer.commit(
            checkpoint.Checkpoint.of(
                record,
                output=output,
                steps_total=self._steps_total,
                consumed_message_ids=[m["id"] for m in output] if consumes_messages else (),
            )
        )

    def _call(self, fn, args, kwargs, record: checkpoint.StepRecord, timeout: float) -> Any:
        """Run ``fn`` on the step thread (``workers.step_thread``); announce it when slow."""
        return call_step(
            fn,
            args,
            kwargs,
            name=record.name,
            timeout=timeout,
            announce=lambda: self._announce(record),
            watch_stuck=self._worker.watch_stuck_step,
        )

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
            self._bounds.lose_lease("lease lost")  # the step's checkpoint will find out too
        else:
            self._bounds.note_flags(*flags)

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
            raise self._bounds.lose_lease(f"lease lost before the side effect of step {record.seq}")

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
        self._last_failure = StepFailure(
            exc, error_kind, found.retry_after, record.seq, record.name
        )
        # Money a failed call cost counts against the ceiling too: a bound, not a retry.
        self._bounds.check_budget()

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
        refused: type[StepError]
        if side_effect and key:
            refused = Retryable
            what = f"{what}; the side effect is retried with its idempotency key"
        elif side_effect:
            refused = Ambiguous
            what = f"{what}; the side effect has no idempotency key, so a person decides"
        else:
            refused = Fatal
        # What the call cost is kept with the failure, as with any failed execution.
        error = refused(
            what,
            tokens_in=record.tokens_in,
            tokens_out=record.tokens_out,
            cost_cents=record.cost_cents,
        )
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
            self._last_failure = StepFailure(error, error.error_kind, None, record.seq, record.name)

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
            raise self._bounds.lose_lease(
                f"lease lost while recording the failure of step {record.seq}"
            )
        self._bounds.spent(cost)

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
