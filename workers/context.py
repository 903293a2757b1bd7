"""RunContext: what an agent function receives, the authoring API over the parts of one execution.

``ctx.step(name, fn, ...)`` gives each call the next sequence number. When
the run's step log (loaded once per claim) holds a ``done`` step at that
number, its stored output is returned and ``fn`` is not called: replay is
free. Otherwise ``fn`` runs on a thread of its own under the step's timeout,
and its outcome is written in one fenced statement
(``runs.engine.steps``); a worker that lost its lease writes nothing and
abandons the run.

``RunContext`` is a facade: each part owns its state and the others use
its public methods only.

- ``workers.steplog.StepLog``: the positions, the replay lookup and the
  nondeterminism check;
- ``workers.bounds.RunBounds``: the lease, people's requests and the bounds
  a new step is checked against (limits, deadline, money);
- ``workers.recording.StepRecorder``: executes a step and records its
  checkpoint or its failure;
- ``workers.workflow.Workflow``: sleep, waits, child runs, approvals and
  messages, each a recorded step;
- ``workers.conversation.Conversation``: a turn's thread, history, state,
  reply and close (``runs.threads``).
"""

from __future__ import annotations

import logging
import uuid as uuid_module
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from uuid import UUID

from runs.db import release_connection
from runs.engine import marks
from runs.states import RunOutcome
from runs.streams import ephemeral
from runs.titles import SUMMARY_MAX, one_line
from workers.bounds import RunBounds
from workers.conversation import Conversation, ThreadInfo
from workers.recording import StepRecorder
from workers.step_options import check_step_options, check_timeout
from workers.step_thread import BETWEEN_STEPS
from workers.steplog import StepLog
from workers.workflow import Workflow

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.engine.steplog import RecordedStep
    from runs.registry import AgentKind
    from workers.bounds import Rollback
    from workers.errors import LeaseLost
    from workers.host import Host, RunControl
    from workers.recording import Compensator, StepFailure
    from workers.steplog import Position
    from workers.values import ChildOutcome, ChildRun, Decision

logger = logging.getLogger(__name__)


def current_run() -> RunContext | None:
    """The run whose agent function is executing here, between its steps.

    None inside a step (the step records whatever happens in it) and outside
    any run. Framework adapters use it to refuse what would run unrecorded.
    """
    return BETWEEN_STEPS.get()


class RunContext:
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
        self._bounds = RunBounds(claimed=claimed, worker=worker, control=control, kind=kind)
        self._log = StepLog(recorded)
        self._recorder = StepRecorder(bounds=self._bounds, log=self._log)
        self._workflow = Workflow(bounds=self._bounds, log=self._log, recorder=self._recorder)
        self._conversation = Conversation(
            bounds=self._bounds, log=self._log, recorder=self._recorder
        )
        # (outcome, summary) of ctx.report(): kept here, written by the exit that ends the run.
        self._reported: tuple[str, str] | None = None

    # What the agent may know about its run.
    @property
    def run_id(self) -> UUID:
        """The run's id, as the API and the dashboard show it."""
        return self._bounds.claim.id

    @property
    def tenant_id(self) -> UUID:
        """The id of the tenant the run belongs to."""
        return self._bounds.claim.tenant_id

    @property
    def claim(self) -> ClaimedRun:
        """The run as this attempt's claim returned it (kind, queue, attempt, timestamps, input)."""
        return self._bounds.claim

    @property
    def worker_id(self) -> UUID:
        """The id of the worker process executing this attempt (its ``Worker`` row)."""
        return self._bounds.worker.id

    @property
    def attempt(self) -> int:
        """How many times the run has been claimed, this claim included.

        1 the first time; one more each time it is taken up again: after a
        retryable failure, a lost worker, a sleep or a wait.
        """
        return self._bounds.claim.attempt

    @property
    def generation(self) -> int:
        """The generation of the run's step log this execution writes: 1, one more at each retry from a step.

        A retry from step N (``POST /api/runs/{id}/retry`` with
        ``from_step``, or of a rolled-back run) starts a new generation
        holding steps 1 to N-1 of the last one; the steps from N on stay
        behind in theirs, for the audit trail.
        """
        return self._bounds.claim.generation

    @property
    def cancelled(self) -> bool:
        """True once a cancel was requested or the lease was lost: a long step may poll it and stop early.

        A compensation is not stopped by the cancel that started its rollback: only a lost lease counts then.
        """
        return self._bounds.cancelled

    @property
    def budget_left_cents(self) -> Decimal | None:
        """What the run may still spend under its cost ceiling (None without a ceiling)."""
        return self._bounds.budget_left_cents

    @property
    def idempotency_key(self) -> str | None:
        """The idempotency key of the step being executed, for passing to the callee."""
        return self._recorder.idempotency_key

    def step_timeout(self, requested: float | None = None) -> float:
        """The timeout (seconds) a step would get now: ``requested``, else the kind's, cut to the deadline left.

        Pass it to a client library (an HTTP or SDK timeout) so that a call
        gives up no later than the engine does. ``requested`` is None or a
        positive, finite number (else ``StepOptionTypeError``/``StepOptionValueError``).
        """
        check_timeout(requested, "ctx.step_timeout()")
        return self._bounds.timeout(requested)

    def progress(self, *, total: int | None = None, message: str | None = None) -> None:
        """Report progress: ``total`` steps expected, and/or a ``message`` for people watching.

        ``total`` is written with the next step's record. A ``message`` is
        written now, as a ``progress`` Event that the run's event stream and
        its page show (one statement: report milestones, not every item).
        """
        if total is not None:
            if total < 0:
                raise ValueError("total must be >= 0")
            self._recorder.expect_steps(total)
        if message:
            try:
                held = marks.record_progress(
                    run_id=self.run_id,
                    token=self._bounds.claim.lease_token,
                    message=str(message),
                    steps_total=self._recorder.steps_total,
                    worker_id=self.worker_id,
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
        self._reported = (value, one_line(summary, limit=SUMMARY_MAX))

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
        return self._recorder.execute(
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
        return self._workflow.approval(name, proposal=proposal)

    def messages(self) -> list[dict]:
        """Messages people sent to this run since the last call, oldest first, at most 100 (a recorded step).

        Each is ``{"id", "text", "author", "at"}``. They are marked consumed
        with this step's checkpoint, so a crash delivers them again and a
        replay sees the same ones.
        """
        return self._workflow.messages()

    # A turn of a conversation (runs.threads).
    @property
    def thread(self) -> ThreadInfo | None:
        """The thread this run is a turn of (``id``, ``turn``, ``title``, ``policy``); None for a plain run."""
        return self._conversation.thread

    def history(self, *, limit: int = 50) -> list[dict]:
        """The thread's last ``limit`` lines (at most 200), oldest first (a recorded step).

        People's messages and the turns' replies, each ``{"id", "role"
        ("user" or "assistant"), "author", "text", "mention", "turn" (the turn
        that read or said it; None: not read yet), "at"}``. Recorded, so a
        replay sees the same conversation however it grew meanwhile.
        """
        return self._conversation.history(limit=limit)

    @property
    def state(self) -> dict:
        """A copy of the thread's state as this turn found it (its canonical agent state).

        The turn's own patches (``update_state``) are not in it: they apply
        to the thread when the turn ends well.
        """
        return self._conversation.state

    def update_state(self, patch: dict) -> dict:
        """Merge ``patch`` into the thread's state at the top level, when this turn ends well (a recorded step).

        A turn that fails or is cancelled leaves the state as it found it.
        Returns the state as it will be: the state found with every patch
        of this turn so far.
        """
        return self._conversation.update_state(patch)

    def reply(self, text: str) -> int:
        """Say ``text`` in the conversation, as this turn's answer (a recorded step); returns its message id.

        Written once however often the step runs; shown at once (the
        thread's stream, the dashboard) and sent with ``thread.asleep``
        when the turn ends.
        """
        return self._conversation.reply(text)

    def close_thread(self, summary: str = "") -> None:
        """End the conversation when this turn ends well: no more turns (a recorded step)."""
        self._conversation.close_thread(summary)

    def wait_for_message(self, *, timeout: float | None = None) -> list[dict]:
        """Return new messages; with none, park the run in ``waiting`` (no worker held) until one arrives.

        With ``timeout`` (seconds), the run wakes after that long without a
        message and this returns ``[]``; the deadline is fixed the first time,
        so a replay returns the same.
        """
        return self._workflow.wait_for_message(timeout=timeout)

    # Time and child runs.
    def sleep(self, seconds: float, *, name: str = "sleep") -> None:
        """Sleep durably for ``seconds``: the run goes back to the queue until then, holding no worker or slot.

        The end is fixed (on the database's clock) the first time; a replay
        skips a finished sleep, and a run woken early sleeps the rest.
        """
        self._workflow.sleep(seconds, name=name)

    def sleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """Sleep durably until ``when`` (an aware datetime, e.g. from ``ctx.now()`` or the input)."""
        self._workflow.sleep_until(when, name=name)

    def spawn(
        self,
        kind: str,
        input: dict,
        *,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> ChildRun:
        """Start a child run of ``kind`` (same tenant, inside this run's budget) in a recorded step.

        Returns a handle for ``gather``. A replayed run never spawns twice:
        the step returns the child it made, and a step executed again after
        a crash finds that child by its key (``key``, unique within this
        run; by default the step's position; a retry from an earlier step
        spawns anew).
        """
        return self._workflow.spawn(kind, input, key=key, queue=queue, priority=priority)

    def gather(
        self,
        children: Iterable[ChildRun | UUID | str],
        *,
        min_success: int | None = None,
        timeout: float | None = None,
        name: str = "gather",
    ) -> list[ChildOutcome]:
        """Wait (in ``waiting``, holding no worker) until the children finished; return their outcomes.

        With ``min_success=N`` it returns as soon as N succeeded, or as soon
        as N can no longer succeed; the children still running are then
        cancelled. With ``timeout`` (seconds) it returns when the time is up,
        cancelling the stragglers. Outcomes come in the order given.
        """
        return self._workflow.gather(children, min_success=min_success, timeout=timeout, name=name)

    # The engine's side of the facade (workers.executor, workers.saga, workers.tracing): not for agent code.
    @property
    def step_log(self) -> StepLog:
        """The positions this execution took and what the run's log holds at each (``workers.steplog``)."""
        return self._log

    @property
    def reported(self) -> tuple[str, str] | None:
        """``(outcome, summary)`` of the last ``ctx.report()``, for the exit that ends the run."""
        return self._reported

    @property
    def last_failure(self) -> StepFailure | None:
        """The last failure a step of this execution raised, as it was recorded."""
        return self._recorder.last_failure

    @property
    def progressed(self) -> bool:
        """A step completed during this execution (the run's consecutive failures start again from 0)."""
        return self._recorder.progressed

    @property
    def compensations(self) -> list[Compensator]:
        """The compensations of the steps this execution ran or replayed, newest first."""
        return self._recorder.compensations

    def compensation_of(self, seq: int) -> Compensator | None:
        return self._recorder.compensation_of(seq)

    def set_rollback(self, mode: Rollback) -> None:
        """Enter a saga's rollback: ``"replay"`` (no step may run), ``"compensate"``, or None (leave it)."""
        self._bounds.set_rollback(mode)

    def lose_lease(self, message: str) -> LeaseLost:
        """Note that the lease is lost (the run is someone else's now) and return the error to raise."""
        return self._bounds.lose_lease(message)

    def execute_step(
        self,
        name: str,
        fn: Callable[..., Any],
        args: tuple,
        kwargs: dict,
        *,
        at: Position | None = None,
        side_effect: bool = False,
        idempotency_key: str | bool | None = None,
        kind: str = "custom",
        input: Any = None,
        compensates: int | None = None,
    ) -> Any:
        """Run ``fn`` as step ``name`` at the next position, or at ``at`` (a position already taken)."""
        return self._recorder.execute(
            name,
            fn,
            args,
            kwargs,
            at=at,
            side_effect=side_effect,
            idempotency_key=idempotency_key,
            kind=kind,
            input=input,
            compensates=compensates,
        )
