"""Error classes of the authoring API, and the control-flow signals of the engine.

Step code raises ``Retryable``, ``Fatal`` or ``Ambiguous`` to say how a
failure is to be handled. The engine's own signals (``RunSignal``: a
``Suspend``, which leaves running without failing, or a ``StopRun``, which
fails the run) derive from ``BaseException`` so that ``except Exception`` in
agent code cannot swallow them.
"""

from __future__ import annotations

from decimal import Decimal
from enum import StrEnum


class StepError(Exception):
    """Base of the classified errors that step code may raise.

    ``retry_after`` (seconds) asks for at least that long before the next
    attempt (up to the backoff's cap). ``tokens_in``, ``tokens_out`` and
    ``cost_cents`` are what the provider reported using before the failure:
    the money is counted all the same.
    """

    error_kind = "fatal"

    def __init__(
        self,
        message: str = "",
        *,
        retry_after: float | None = None,
        tokens_in: int = 0,
        tokens_out: int = 0,
        cost_cents: Decimal | float | int = 0,
    ):
        super().__init__(message)
        self.retry_after = retry_after
        # Usage the provider reported before the failure: the money is kept.
        self.usage = (tokens_in, tokens_out, cost_cents)


class Retryable(StepError):
    """A transient failure: the run is queued again after a backoff."""

    error_kind = "retryable"


class Fatal(StepError):
    """A failure retrying cannot fix: the run fails at once."""

    error_kind = "fatal"


class Ambiguous(StepError):
    """A side effect may or may not have happened: a person decides."""

    error_kind = "ambiguous"


class InvalidStepOption(Fatal):
    """A durable call (``ctx.step``) was given an option it cannot honour: the run fails at once, never retried.

    Raised at the call, before anything runs or is written. Catch it as the
    ``TypeError`` or ``ValueError`` it also is.
    """


class StepOptionTypeError(InvalidStepOption, TypeError):
    """An option of the wrong type (a ``timeout`` that is not a number, an ``fn`` that is not callable)."""


class StepOptionValueError(InvalidStepOption, ValueError):
    """An option of the right type but an unusable value (an unknown ``kind``, a ``timeout`` of 0)."""


class RunSignal(BaseException):  # noqa: N818 - a signal, not an error
    """The engine's control flow: this execution of the run ends here, and the executor says how it leaves running.

    Either a ``Suspend`` (the run leaves without failing) or a ``StopRun``
    (it fails now). Agent code does not raise or catch these.
    """


class Suspend(RunSignal):
    """The run leaves the worker without failing (parked, released or abandoned)."""


class ReleaseReason(StrEnum):
    """Why a run is given back (``ReleaseRun.reason``); the exit's ``reason``, in its Event's payload."""

    SHUTDOWN = "shutdown"  # the worker is stopping (SIGTERM): the run is queued for another worker
    CANCEL_REQUESTED = "cancel_requested"  # a person cancelled it: the exit makes it cancelled
    PAUSE_REQUESTED = "pause_requested"  # a person paused it: the exit makes it paused


class ReleaseRun(Suspend):
    """Give the run back before its next step, spending nothing, for ``reason`` (a ``ReleaseReason``).

    The worker hands it to the exit as if to the queue; the exit honours a
    requested cancel or pause (``runs.engine.exit``), so a run released for
    one ends cancelled or paused, and one released by a shutdown is queued.
    """

    def __init__(self, reason: ReleaseReason, message: str = ""):
        super().__init__(message or f"released: {reason.value}")
        self.reason = reason


class LeaseLost(Suspend):
    """Another worker (or the reaper) owns this run now: stop touching it."""


class StopRun(RunSignal):
    """The run fails now with ``error_kind`` (a bound was reached); never retried by itself."""

    def __init__(self, error_kind: str, message: str):
        super().__init__(message)
        self.error_kind = error_kind


class NonDeterministic(StopRun):
    """Replay met a different step than the one recorded at this position."""

    def __init__(self, *, seq: int, recorded: str, requested: str, what: str = "step"):
        self.seq, self.recorded, self.requested = seq, recorded, requested
        super().__init__(
            "nondeterministic",
            f"step {seq} was recorded as {recorded!r} but the code now runs {what} {requested!r}: "
            "agent code must take the same steps in the same order on replay",
        )


class ParkForHuman(Suspend):
    """The run waits for a person: a side effect may or may not have happened."""


class AwaitApproval(Suspend):
    """The run waits for a person to approve or reject a proposal."""


class AwaitMessage(Suspend):
    """The run waits in `waiting` until a message arrives (or its timer, ``wake_at``, is due)."""

    def __init__(self, message: str = "", *, wake_at=None):
        super().__init__(message)
        self.wake_at = wake_at


class AwaitChildren(Suspend):
    """The run waits in `waiting` until enough of the children it gathers finished (or ``wake_at``)."""

    def __init__(self, message: str = "", *, wake_at=None):
        super().__init__(message)
        self.wake_at = wake_at


class Sleep(Suspend):
    """The run goes back to `queued` until ``until`` (a durable sleep)."""

    def __init__(self, message: str = "", *, until):
        super().__init__(message)
        self.until = until


class AwaitCapacity(Suspend):
    """A rate limit shared by every worker has no room now (runs.engine.ratelimits): the run goes
    back to `queued` until ``until`` (the database's clock), spending nothing, holding no worker."""

    def __init__(self, message: str = "", *, key: str, until):
        super().__init__(message or f"rate limit {key!r} has no room until {until.isoformat()}")
        self.key = key
        self.until = until


class ReplayEnded(Suspend):
    """Replaying a run to roll it back reached a step that never finished (workers.saga)."""


class StepTimeout(TimeoutError):
    """A step did not return within its timeout (it may still be running in its thread)."""
