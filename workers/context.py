"""RunContext: what an agent function receives, and how a step is checkpointed.

``ctx.step(name, fn, ...)`` gives each call the next sequence number. When
the run's step log (loaded once per claim) holds a ``done`` step at that
number, its stored output is returned and ``fn`` is not called: replay is
free. Otherwise ``fn`` runs on a thread of its own under the step's timeout,
and its outcome is written in one fenced statement
(``runs.engine.steps``); a worker that lost its lease writes nothing and
abandons the run.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
import uuid as uuid_module
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from uuid import UUID

from django.conf import settings

from runs.db import dumps, release_connection
from runs.engine import steps as checkpoint
from runs.engine.steps import RecordedStep, unconsumed_messages
from workers.classify import classify
from workers.errors import (
    AwaitApproval,
    AwaitMessage,
    Fatal,
    LeaseLost,
    NonDeterministic,
    ParkForHuman,
    ReleaseRun,
    StepTimeout,
    StopRun,
    Suspend,
)
from workers.step_support import (
    Decision,
    Host,
    RunControl,
    StepFailure,
    StepResult,
    StepThread,
)

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.registry import AgentKind

logger = logging.getLogger(__name__)

# A step still running after this long is written as the run's current step.
ANNOUNCE_AFTER_SECONDS = 0.2


class RunContext:
    """The API an agent function uses: steps, progress, and what it may know of its run."""

    def __init__(
        self, *, claimed: ClaimedRun, recorded: dict[int, RecordedStep], worker: Host, control: RunControl,
        kind: AgentKind,
    ):
        self._claimed = claimed
        self._recorded = recorded
        self._worker = worker
        self._control = control
        self._kind = kind
        self._seq = 0
        self._model_steps = 0
        self._steps_total: int | None = None
        self._idempotency_key: str | None = None
        self._cost = Decimal(claimed.cost_cents)
        self._claimed_clock = time.monotonic()
        self.last_failure: StepFailure | None = None
        self.progressed = False  # a step completed during this attempt
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
    def budget_left_cents(self) -> Decimal | None:
        """What the run may still spend under its cost ceiling (None without a ceiling)."""
        ceiling = self._claimed.cost_ceiling_cents
        return None if ceiling is None else max(Decimal(0), Decimal(ceiling) - self._cost)

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key of the step being executed, for passing to the callee."""
        return self._idempotency_key

    def step_timeout(self, requested: float | None = None) -> float:
        """The timeout (seconds) a step would get now: ``requested``, else the kind's, cut to the deadline left.

        Pass it to a client library (an HTTP or SDK timeout) so that a call
        gives up no later than the engine does.
        """
        return self._timeout(requested)

    def progress(self, *, total: int | None = None, message: str | None = None) -> None:
        """Announce the number of steps the run expects; written with the next step's record."""
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

        ``side_effect=True`` writes the step ahead of calling ``fn``: if the
        worker dies inside it, or it times out or loses its connection, the
        run waits for a person instead of repeating the effect, unless the
        step has an ``idempotency_key`` (a string, or ``True`` for
        ``{run_id}:{generation}:{seq}``; ``ctx.idempotency_key`` holds it
        for the callee), in which case it is re-executed with the same key.
        ``timeout`` (seconds) overrides the kind's step timeout. ``kind`` is
        ``llm`` for a model call (counted against the model-iteration limit),
        ``tool``, or ``custom``.
        """
        return self._run_step(name, fn, args, kwargs, side_effect=side_effect, idempotency_key=idempotency_key,
                              timeout=timeout, kind=kind)

    def _run_step(self, name, fn, args, kwargs, *, side_effect=False, idempotency_key=None, timeout=None,
                  kind="custom", consumes_messages=False) -> Any:
        seq = self._seq = self._seq + 1
        if kind == "llm":
            self._model_steps += 1
        key = self._step_idempotency_key(seq, idempotency_key)
        recorded = self._recorded.get(seq)
        if recorded is not None:
            if recorded.name != name:
                raise NonDeterministic(
                    f"step {seq} was recorded as {recorded.name!r} but the code now runs {name!r}: "
                    "agent code must take the same steps in the same order on replay"
                )
            if recorded.status == "done":
                return recorded.output
            if recorded.status in ("running", "waiting"):
                # Written ahead of a side effect whose outcome nobody recorded.
                if not recorded.idempotency_key:
                    self._park_unknown_outcome(seq, name, kind, args, kwargs)
                key = recorded.idempotency_key
        self._before_step(seq, kind)

        record = checkpoint.StepRecord(
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
        if side_effect:
            self._write_ahead(record)
        self._idempotency_key = key
        try:
            value = self._call(fn, args, kwargs, record, self._timeout(timeout))
        except Suspend:
            raise
        except Exception as exc:
            self._step_failed(record, exc, uncertain_means_ambiguous=side_effect and not key)
            if self._deadline_left() <= 0:
                raise StopRun("deadline", self._deadline_message()) from exc
            raise
        finally:
            self._idempotency_key = None

        output = value.output if isinstance(value, StepResult) else value
        if isinstance(value, StepResult):
            record.tokens_in = value.tokens_in
            record.tokens_out = value.tokens_out
            record.cost_cents = Decimal(str(value.cost_cents))
        try:
            answer = checkpoint.checkpoint(
                record,
                output=output,
                worker_id=self._worker.id,
                lease=self._worker.lease,
                steps_total=self._steps_total,
                consumed_message_ids=[m["id"] for m in output] if consumes_messages else None,
            )
        except TypeError as exc:  # the output is not JSON: nothing was written
            release_connection()
            error = Fatal(f"step {name!r} returned data that is not JSON-serialisable: {exc}")
            self._step_failed(record, error, uncertain_means_ambiguous=False)
            raise error from None
        except BaseException:
            release_connection()
            raise
        # The run keeps its connection while it is busy with fast steps; a
        # slow step hands it back (see _call), and so does leaving running.
        if answer is None:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost while checkpointing step {seq} ({name})")
        cancel, pause, self._cost, output_json = answer
        self.progressed = True  # the checkpoint reset the run's failures to 0
        self._note_flags(cancel, pause)
        result = json.loads(output_json)
        self._recorded[seq] = RecordedStep(seq=seq, name=name, status="done", output=result)
        self._check_budget()
        return result

    # Deterministic values, recorded as steps so replay sees the same ones.
    def now(self) -> datetime:
        """The current time, recorded: replay returns the same instant."""
        value = self.step("now", lambda: datetime.now(UTC).isoformat())
        return datetime.fromisoformat(value)

    def uuid(self) -> UUID:
        """A random UUID, recorded: replay returns the same one."""
        return UUID(self.step("uuid", lambda: str(uuid_module.uuid4())))

    # People in the loop.
    def approval(self, name: str, *, proposal: Any) -> Decision:
        """Ask a person to approve ``proposal``; the run waits (holding no worker) until they decide.

        Returns the decision (``approved``, ``comment``, ``by``, ``at``). The
        proposal is recorded in the step; replays return the same decision
        and never ask again.
        """
        seq = self._seq = self._seq + 1
        recorded = self._recorded.get(seq)
        if recorded is not None:
            if recorded.name != name:
                raise NonDeterministic(
                    f"step {seq} was recorded as {recorded.name!r} but the code now asks for approval {name!r}"
                )
            if recorded.status == "done":
                return Decision.from_output(recorded.output)
        self._before_step(seq, "approval")
        try:
            dumps(proposal)
        except (TypeError, ValueError) as exc:
            raise Fatal(f"the proposal of approval {name!r} is not JSON-serialisable: {exc}") from None
        record = checkpoint.StepRecord(
            run_id=self.run_id, token=self._claimed.lease_token, generation=self._claimed.generation,
            seq=seq, name=name, kind="approval", input={"proposal": proposal}, started_at=datetime.now(UTC),
        )
        try:
            written = checkpoint.record_pending(record)
        finally:
            release_connection()
        if not written:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost while asking for approval {name!r}")
        raise AwaitApproval(f"waiting for approval of {name!r} (step {seq})")

    def messages(self) -> list[dict]:
        """Messages people sent to this run since the last call, oldest first, at most 100 (a recorded step).

        Each is ``{"id", "text", "author", "at"}``. They are marked consumed
        with this step's checkpoint, so a crash delivers them again and a
        replay sees the same ones.
        """
        return self._run_step("messages", unconsumed_messages, (self.run_id,), {}, kind="message",
                              consumes_messages=True)

    def wait_for_message(self) -> list[dict]:
        """Return new messages; with none, park the run in ``waiting`` (no worker held) until one arrives."""
        if self._recorded.get(self._seq + 1) is None:
            self._before_step(self._seq + 1, "message")
            try:
                pending = unconsumed_messages(self.run_id, limit=1)
            finally:
                release_connection()
            if not pending:
                raise AwaitMessage("waiting for a message")
        return self.messages()

    # Bounds and signals.
    def _before_step(self, seq: int, kind: str) -> None:
        """A new step starts only while the run is still ours, wanted, and within its bounds."""
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
        if seq > self._kind.max_steps:
            raise StopRun("step_limit", f"the run reached its limit of {self._kind.max_steps} steps")
        if kind == "llm" and self._model_steps > self._kind.max_model_iterations:
            raise StopRun(
                "step_limit", f"the run reached its limit of {self._kind.max_model_iterations} model calls"
            )
        if self._deadline_left() <= 0:
            raise StopRun("deadline", self._deadline_message())
        self._check_budget()

    def _check_budget(self) -> None:
        ceiling = self._claimed.cost_ceiling_cents
        if ceiling is not None and self._cost > ceiling:
            raise StopRun("budget", f"the run cost {self._cost:.6f}¢, over its ceiling of {ceiling}¢")

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
        box, finished = runner.submit(fn, args, kwargs)
        if not finished.wait(min(ANNOUNCE_AFTER_SECONDS, timeout)):
            self._announce(record.name)  # and hand the connection back while waiting
            if not finished.wait(max(0.0, timeout - (time.monotonic() - started))):
                StepThread.abandon_this_thread()  # the next step gets a fresh thread
                self._worker.watch_stuck_step(runner.thread, timeout)
                raise StepTimeout(f"step {record.name!r} did not return within {timeout:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _announce(self, name: str) -> None:
        try:
            flags = checkpoint.announce_step(
                run_id=self.run_id, token=self._claimed.lease_token, name=name, steps_total=self._steps_total
            )
        finally:
            release_connection()
        if flags is None:
            self._control.lease_lost.set()  # the step's checkpoint will find out too
        else:
            self._note_flags(*flags)

    def _write_ahead(self, record: checkpoint.StepRecord) -> None:
        try:
            written = checkpoint.begin_side_effect(record, steps_total=self._steps_total)
        finally:
            release_connection()
        if not written:
            self._control.lease_lost.set()
            raise LeaseLost(f"lease lost before the side effect of step {record.seq}")

    def _step_failed(self, record: checkpoint.StepRecord, exc: BaseException, *, uncertain_means_ambiguous: bool) -> None:
        found = classify(exc)
        error_kind = found.kind
        if uncertain_means_ambiguous and found.kind == "retryable" and found.uncertain:
            error_kind = "ambiguous"
        usage = getattr(exc, "usage", None)
        if usage:
            record.tokens_in, record.tokens_out = usage[0], usage[1]
            record.cost_cents = Decimal(str(usage[2]))
        self._record(record, exc, error_kind, status="waiting" if error_kind == "ambiguous" else "failed")
        self.last_failure = StepFailure(exc, error_kind, found.retry_after, record.seq, record.name)
        # Money a failed call cost counts against the ceiling too: a bound, not a retry.
        self._check_budget()

    def _park_unknown_outcome(self, seq: int, name: str, kind: str, args, kwargs) -> None:
        message = (
            f"step {seq} ({name}) was interrupted after its side effect began and has no idempotency key: "
            "the effect may or may not have happened, so a person decides"
        )
        record = checkpoint.StepRecord(
            run_id=self.run_id, token=self._claimed.lease_token, generation=self._claimed.generation,
            seq=seq, name=name, kind=kind, input=_describe_args(args, kwargs), started_at=datetime.now(UTC),
        )
        self._record(record, None, "ambiguous", status="waiting", error=message)
        raise ParkForHuman(message)

    def _record(self, record, exc: BaseException | None, error_kind: str, *, status: str, error: str = "") -> None:
        try:
            cost = checkpoint.record_step_failure(
                record, error=error or _format_error(exc), error_kind=error_kind,
                worker_id=self._worker.id, status=status,
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
        dumps(payload)
        return payload
    except (TypeError, ValueError):
        return {"repr": repr(payload)[:2000]}


def _format_error(exc: BaseException | None) -> str:
    if exc is None:
        return ""
    text = "".join(traceback.format_exception(exc))
    return f"{type(exc).__name__}: {exc}\n\n{text[-8000:]}"
