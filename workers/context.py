"""RunContext: what an agent function receives, and how a step is checkpointed.

``ctx.step(name, fn, ...)`` gives each call the next sequence number. When
the run's step log (loaded once per claim) holds a ``done`` step at that
number, its stored output is returned and ``fn`` is not called: replay is
free. Otherwise ``fn`` runs and its outcome is written in one fenced
statement (``workers.queue.checkpoint``); a worker that lost its lease
writes nothing and abandons the run.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid as uuid_module
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from uuid import UUID

from workers import queue
from workers.errors import Fatal, LeaseLost, NonDeterministic, ReleaseRun, Suspend
from workers.queue import release_connection

if TYPE_CHECKING:
    from workers.queue import ClaimedRun

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StepResult:
    """What a step function may return instead of plain data: its output plus usage and cost."""

    output: Any
    tokens_in: int = 0
    tokens_out: int = 0
    cost_cents: Decimal | float | int = 0


@dataclass(frozen=True)
class RecordedStep:
    seq: int
    name: str
    status: str
    output: Any


class RunControl:
    """Flags shared between the worker's threads and one executing run."""

    def __init__(self) -> None:
        self.cancel_requested = threading.Event()
        self.pause_requested = threading.Event()
        self.lease_lost = threading.Event()


class RunContext:
    """The API an agent function uses: steps, progress, and what it may know of its run."""

    def __init__(self, *, claimed: ClaimedRun, recorded: dict[int, RecordedStep], worker, control: RunControl):
        self._claimed = claimed
        self._recorded = recorded
        self._worker = worker
        self._control = control
        self._seq = 0
        self._steps_total: int | None = None
        self._idempotency_key: str | None = None
        if claimed.cancel_requested:
            control.cancel_requested.set()
        if claimed.pause_requested:
            control.pause_requested.set()

    # What the agent may know about its run.
    @property
    def run_id(self) -> UUID:
        return self._claimed.id

    @property
    def tenant_id(self) -> UUID:
        return self._claimed.tenant_id

    @property
    def attempt(self) -> int:
        return self._claimed.attempt

    @property
    def generation(self) -> int:
        return self._claimed.generation

    @property
    def cancelled(self) -> bool:
        """True once a cancel was requested or the lease was lost: a long step may poll it and stop early."""
        return self._control.cancel_requested.is_set() or self._control.lease_lost.is_set()

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key of the step being executed, for passing to the callee."""
        return self._idempotency_key

    def progress(self, *, total: int | None = None, message: str | None = None) -> None:
        """Announce the number of steps the run expects; written with the next checkpoint."""
        if total is not None:
            if total < 0:
                raise ValueError("total must be >= 0")
            self._steps_total = total
        if message:
            logger.info("progress: %s", message, extra={"run_id": str(self.run_id)})

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        side_effect: bool = False,
        idempotency_key: str | bool | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
        kind: str = "custom",
        **kwargs: Any,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as the checkpointed step ``name`` and return its output.

        On replay (the run resumed after a crash, a release or a retry) a
        step that already finished returns its recorded output without
        calling ``fn``. ``fn`` returns JSON-serialisable data or a
        ``StepResult``; the value returned here is the JSON round trip of
        that data, on the first execution and on replay alike.
        """
        seq = self._seq = self._seq + 1
        recorded = self._recorded.get(seq)
        if recorded is not None:
            if recorded.name != name:
                raise NonDeterministic(
                    f"step {seq} was recorded as {recorded.name!r} but the code now runs {name!r}: "
                    "agent code must take the same steps in the same order on replay"
                )
            if recorded.status == "done":
                return recorded.output
        self._before_step()

        key = self._step_idempotency_key(seq, idempotency_key)
        record = queue.StepRecord(
            run_id=self.run_id,
            token=self._claimed.lease_token,
            generation=self._claimed.generation,
            seq=seq,
            name=name,
            kind=kind,
            input=_describe_args(args, kwargs),
            started_at=datetime.now(UTC),
            idempotency_key=key or "",
        )
        self._idempotency_key = key
        try:
            value = fn(*args, **kwargs)
        except Suspend:
            raise
        except Exception as exc:
            self._record_failure(record, exc)
            raise
        finally:
            self._idempotency_key = None
            # Step code may have used the ORM: hand its connection back.
            release_connection()

        output = value.output if isinstance(value, StepResult) else value
        if isinstance(value, StepResult):
            record.tokens_in = value.tokens_in
            record.tokens_out = value.tokens_out
            record.cost_cents = Decimal(str(value.cost_cents))
        try:
            output_json = queue.dumps(output)
        except TypeError as exc:
            error = Fatal(f"step {name!r} returned data that is not JSON-serialisable: {exc}")
            self._record_failure(record, error)
            raise error from None
        try:
            answer = queue.checkpoint(
                record,
                output_json=output_json,
                worker_id=self._worker.id,
                lease=self._worker.lease,
                steps_total=self._steps_total,
            )
        finally:
            release_connection()
        if answer is None:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost while checkpointing step {seq} ({name})")
        cancel, pause, _cost = answer
        if cancel:
            self._control.cancel_requested.set()
        if pause:
            self._control.pause_requested.set()
        result = json.loads(output_json)
        self._recorded[seq] = RecordedStep(seq=seq, name=name, status="done", output=result)
        return result

    def _before_step(self) -> None:
        """A new step starts only while the run is still ours and wanted."""
        if self._control.lease_lost.is_set():
            raise LeaseLost("lease lost")
        if not self._worker.lease_is_fresh():
            # Heartbeats have failed for lease - heartbeat seconds: another
            # worker may own the run soon, so start nothing new.
            self._control.lease_lost.set()
            raise LeaseLost("heartbeats failing; not starting a new step")
        if self._control.cancel_requested.is_set() or self._control.pause_requested.is_set():
            raise ReleaseRun("cancel or pause requested")
        if self._worker.stopping.is_set():
            raise ReleaseRun("worker shutting down")

    def _step_idempotency_key(self, seq: int, requested: str | bool | None) -> str | None:
        if requested is True:
            return f"{self.run_id}:{self.generation}:{seq}"
        if isinstance(requested, str) and requested:
            return requested
        return None

    def _record_failure(self, record: queue.StepRecord, exc: BaseException) -> None:
        from workers.errors import classify

        kind, _ = classify(exc)
        try:
            written = queue.record_step_failure(
                record, error=_format_error(exc), error_kind=kind, worker_id=self._worker.id
            )
        finally:
            release_connection()
        if not written:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost while recording the failure of step {record.seq}")

    # Deterministic values, recorded as steps so replay sees the same ones.
    def now(self) -> datetime:
        """The current time, recorded: replay returns the same instant."""
        value = self.step("now", lambda: datetime.now(UTC).isoformat())
        return datetime.fromisoformat(value)

    def uuid(self) -> UUID:
        """A random UUID, recorded: replay returns the same one."""
        return UUID(self.step("uuid", lambda: str(uuid_module.uuid4())))


def _describe_args(args: tuple, kwargs: dict) -> Any:
    """The step input for the audit trail: the arguments when they are JSON, else their repr."""
    payload: dict[str, Any] = {}
    if args:
        payload["args"] = list(args)
    if kwargs:
        payload["kwargs"] = kwargs
    if not payload:
        return None
    try:
        queue.dumps(payload)
        return payload
    except TypeError:
        return {"repr": repr(payload)[:2000]}


def _format_error(exc: BaseException) -> str:
    import traceback

    text = "".join(traceback.format_exception(exc))
    return f"{type(exc).__name__}: {exc}\n\n{text[-8000:]}"
