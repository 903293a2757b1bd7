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
import uuid as uuid_module
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from uuid import UUID

from runs.db import dumps, release_connection
from runs.engine import marks
from runs.engine import steps as checkpoint
from runs.engine.steplog import RecordedStep, unconsumed_messages
from runs.metrics import process as metrics
from runs.states import RunOutcome
from runs.streams import ephemeral
from runs.titles import SUMMARY_MAX, one_line
from workers.errors import (
    AwaitApproval,
    Fatal,
    LeaseLost,
    StopRun,
    Suspend,
)
from workers.proposals import Proposal
from workers.recording import BETWEEN_STEPS, REFUSED, Compensator, StepMachinery, describe_args
from workers.step_options import check_step_options, check_timeout
from workers.step_support import (
    Decision,
    Host,
    RunControl,
    StepFailure,
    StepResult,
)
from workers.steplog import Position, StepLog
from workers.tracing import observed_step
from workers.workflow import Workflow

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.registry import AgentKind

logger = logging.getLogger(__name__)

# Steps written as `waiting` while the run sleeps or waits (not ahead of a side effect).
WAITING_KINDS = frozenset({"sleep", "message", "child"})


def current_run() -> RunContext | None:
    """The run whose agent function is executing here, between its steps.

    None inside a step (the step records whatever happens in it) and outside
    any run. Framework adapters use it to refuse what would run unrecorded.
    """
    return BETWEEN_STEPS.get()


class RunContext(Workflow, StepMachinery):
    """The API an agent function uses: steps, progress, and what it may know of its run."""

    def __init__(
        self,
        *,
        claimed: ClaimedRun,
        recorded: dict[int, RecordedStep],
        worker: Host,
        control: RunControl,
        kind: AgentKind,
    ):
        self._claimed = claimed
        self._log = StepLog(recorded)
        self._worker = worker
        self._control = control
        self._kind = kind
        self._model_steps = 0
        self._steps_total: int | None = None
        self._idempotency_key: str | None = None
        # What the run spent, with what its finished children spent: its ceiling bounds both.
        self._cost = Decimal(claimed.cost_cents) + Decimal(claimed.children_cost_cents)
        self._claimed_clock = time.monotonic()
        self.last_failure: StepFailure | None = None
        self._rollback = None
        self._compensations = {}
        self.progressed = False  # a step completed during this attempt
        # (outcome, summary) of ctx.report(): kept here, written by the exit that ends the run.
        self.reported: tuple[str, str] | None = None
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
    def claim(self) -> ClaimedRun:
        """The run as this attempt's claim returned it (kind, queue, attempt, timestamps, input)."""
        return self._claimed

    @property
    def worker_id(self) -> UUID:
        """The id of the worker process executing this attempt (its ``Worker`` row)."""
        return self._worker.id

    @property
    def attempt(self) -> int:
        return self._claimed.attempt

    @property
    def generation(self) -> int:
        return self._claimed.generation

    @property
    def cancelled(self) -> bool:
        """True once a cancel was requested or the lease was lost: a long step may poll it and stop early.

        A compensation is not stopped by the cancel that started its rollback: only a lost lease counts then.
        """
        if self._rollback == "compensate":
            return self._control.lease_lost.is_set()
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
        gives up no later than the engine does. ``requested`` is None or a
        positive, finite number (else ``StepOptionTypeError``/``StepOptionValueError``).
        """
        check_timeout(requested, "ctx.step_timeout()")
        return self._timeout(requested)

    def progress(self, *, total: int | None = None, message: str | None = None) -> None:
        """Report progress: ``total`` steps expected, and/or a ``message`` for people watching.

        ``total`` is written with the next step's record. A ``message`` is
        written now, as a ``progress`` Event that the run's event stream and
        its page show (one statement: report milestones, not every item).
        """
        if total is not None:
            if total < 0:
                raise ValueError("total must be >= 0")
            self._steps_total = total
        if message:
            try:
                held = marks.record_progress(
                    run_id=self.run_id,
                    token=self._claimed.lease_token,
                    message=str(message),
                    steps_total=self._steps_total,
                    worker_id=self._worker.id,
                )
            finally:
                release_connection()
            if not held:
                raise self.lose_lease("lease lost while reporting progress")

    def report(self, summary: str, *, outcome: RunOutcome | str = RunOutcome.SUCCEEDED) -> None:
        """Say what the run achieved: ``summary``, one line people read in run lists, and its ``outcome``.

        ``outcome`` is a ``RunOutcome`` or its value: ``succeeded`` (the
        default), ``unchanged`` (it finished but changed nothing: a person
        rejected the change, there was nothing to do) or ``partial`` (some
        of the work is done). It qualifies the run's status without changing
        it: a run that returns is ``done`` whatever it reports.

        Nothing is written now: the last report is stored with the run's
        exit when the run ends, done, or failed or cancelled after reporting
        (then it tells what was achieved before). Like the rest of the agent
        code between steps it runs again on replay, so a resumed run reports
        again. ``summary`` is made one line of at most 300 characters
        (control characters and line breaks become spaces, longer text ends
        with an ellipsis). Raises ValueError for an unknown outcome and
        TypeError when ``summary`` is not a string.
        """
        if not isinstance(summary, str):
            raise TypeError(
                f"ctx.report() needs the summary as a string, not {type(summary).__name__}"
            )
        value = outcome.value if isinstance(outcome, RunOutcome) else outcome
        if value not in RunOutcome.values or not value:
            choices = ", ".join(repr(v) for v in RunOutcome.values if v)
            raise ValueError(
                f"unknown outcome {outcome!r} for ctx.report(); use RunOutcome or one of {choices}"
            )
        self.reported = (value, one_line(summary, limit=SUMMARY_MAX))

    def emit(self, type: str, data: Any = None) -> None:
        """Push an ephemeral update (partial model text, a percentage) to the run's live event streams.

        It is not stored and never replayed: a client connected now sees it
        as an SSE event ``type`` without an ``id:``; one that connects later
        does not. Best effort: a failure to send is logged, never raised.
        Raises ValueError when ``type`` is not a short name (letters,
        digits, ``. _ : -``) or ``data`` is not JSON or over 7000 bytes of it.
        """
        # Refuses bad input before any I/O; names the step in progress (or the last one).
        payload = ephemeral.encode(self.run_id, type, data, step=self._log.last_taken or None)
        try:
            ephemeral.send(self.run_id, payload)
        except Exception:  # a stream update is never worth failing a step for
            logger.debug("could not emit %s for run %s", type, self.run_id, exc_info=True)
        finally:
            release_connection()

    def step(
        self,
        name: str,
        fn: Callable[..., Any],
        *args: Any,
        kwargs: Mapping[str, Any] | None = None,
        kind: str = "custom",
        side_effect: bool = False,
        idempotency_key: str | bool | None = None,
        timeout: float | None = None,
        compensate: Callable[..., Any] | None = None,
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` as the checkpointed step ``name`` and return its output.

        ``fn``'s positional arguments follow it; its keyword arguments go in
        ``kwargs=`` (a dict), apart from the step's own options, so that
        ``ctx.step("fetch", fetch, url, kwargs={"timeout": 7}, timeout=30)``
        calls ``fetch(url, timeout=7)`` under a 30 s step timeout. Every
        option is checked here, before anything runs or is written: an
        unknown option is Python's ``TypeError``, a bad one a
        ``StepOptionTypeError`` or ``StepOptionValueError`` (``Fatal``, a
        ``TypeError``/``ValueError``): either fails the run at once, naming it.

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
        ``timeout`` (seconds, positive) overrides the kind's step timeout.
        ``kind`` is ``llm`` for a model call (counted against the
        model-iteration limit), ``tool``, or ``custom`` (the default).

        ``compensate=fn`` makes the step part of a saga: when the run fails
        for good on an error its kind lists in ``compensate_on``, or is
        cancelled with ``compensate``, ``fn(output)`` undoes it, in reverse
        order of the steps, as a recorded ``compensation`` step with its own
        idempotency key (``ctx.idempotency_key`` inside ``fn``).
        """
        kwargs = check_step_options(
            name,
            fn,
            kwargs,
            kind=kind,
            side_effect=side_effect,
            idempotency_key=idempotency_key,
            timeout=timeout,
            compensate=compensate,
        )
        return self.execute_step(
            name,
            fn,
            args,
            kwargs,
            side_effect=side_effect,
            idempotency_key=idempotency_key,
            timeout=timeout,
            kind=kind,
            compensate=compensate,
        )

    # The engine's side of the facade (workers.executor, workers.saga, workers.workflow): not for agent code.
    @property
    def step_log(self) -> StepLog:
        """The positions this execution took and what the run's log holds at each (``workers.steplog``)."""
        return self._log

    @property
    def compensations(self) -> list[Compensator]:
        """The compensations of the steps this execution ran or replayed, newest first."""
        return sorted(self._compensations.values(), key=lambda c: -c.seq)

    def compensation_of(self, seq: int) -> Compensator | None:
        return self._compensations.get(seq)

    def set_rollback(self, mode: str | None) -> None:
        """Enter a saga's rollback: ``"replay"`` (no step may run), ``"compensate"``, or None (leave it)."""
        self._rollback = mode

    def lose_lease(self, message: str) -> LeaseLost:
        """Note that the lease is lost (the run is someone else's now) and return the error to raise."""
        self._control.lease_lost.set()
        return LeaseLost(message)

    def execute_step(
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
            self._model_steps += 1
        key = self._step_idempotency_key(seq, idempotency_key)
        if recorded is not None:
            if recorded.status in ("done", "compensated"):
                self._remember_compensation(
                    seq, name, compensate, recorded.output, recorded.idempotency_key
                )
                return recorded.output
        self._replay_ends_here()
        if (
            recorded is not None
            and recorded.status in ("running", "waiting")
            and recorded.kind not in WAITING_KINDS
        ):
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
            value = self._call(fn, args, kwargs, record, self._timeout(timeout))
        except Suspend:
            raise
        except BaseException as exc:  # noqa: BLE001 - a step's SystemExit is its failure too (workers.classify)
            metrics.step_finished(
                kind=self._claimed.kind,
                step_kind=kind,
                status="failed",
                seconds=time.monotonic() - started,
            )
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
            answer = self._checkpoint(record, output, consumes_messages)
        except TypeError as exc:  # the output is not JSON: nothing was written
            release_connection()
            error = Fatal(f"step {name!r} returned data that is not JSON-serialisable: {exc}")
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
            raise self.lose_lease(f"lease lost while checkpointing step {seq} ({name})")
        cancel, pause, self._cost, output_json = answer
        metrics.step_finished(
            kind=self._claimed.kind,
            step_kind=kind,
            status="done",
            seconds=time.monotonic() - started,
        )
        self.progressed = True  # the checkpoint reset the run's failures to 0
        self._note_flags(cancel, pause)
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
        self._check_budget()
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

        ``proposal`` is a ``workers.Proposal`` (what will change, on what,
        from what to what: the dashboard shows it as a sentence and a
        before/after table) or any JSON value (shown as it is). Returns the
        decision (``approved``, ``comment``, ``by``, ``at``). The proposal is
        recorded in the step as JSON; replays return the same decision and
        never ask again.
        """
        if isinstance(proposal, Proposal):
            proposal = proposal.to_json()
        position = self._log.take(name, what="approval")
        seq = position.seq
        if position.done:
            return Decision.from_output(position.recorded.output)
        self._before_step(seq, "approval")
        try:
            dumps(proposal)
        except (TypeError, ValueError) as exc:
            raise Fatal(
                f"the proposal of approval {name!r} is not JSON-serialisable: {exc}"
            ) from None
        record = checkpoint.StepRecord(
            run_id=self.run_id,
            token=self._claimed.lease_token,
            generation=self._claimed.generation,
            seq=seq,
            name=name,
            kind="approval",
            input={"proposal": proposal},
            started_at=datetime.now(UTC),
        )
        try:
            written = marks.record_pending(record)
        finally:
            release_connection()
        if not written:
            raise self.lose_lease(f"lease lost while asking for approval {name!r}")
        raise AwaitApproval(f"waiting for approval of {name!r} (step {seq})")

    def messages(self) -> list[dict]:
        """Messages people sent to this run since the last call, oldest first, at most 100 (a recorded step).

        Each is ``{"id", "text", "author", "at"}``. They are marked consumed
        with this step's checkpoint, so a crash delivers them again and a
        replay sees the same ones.
        """
        return self.execute_step(
            "messages",
            unconsumed_messages,
            (self.run_id,),
            {},
            kind="message",
            consumes_messages=True,
        )
