"""Whether one execution of a run may start another step: its lease, people's requests, its bounds.

``RunBounds`` holds what a new step is checked against and nothing else
writes: the claim, the worker and the flags its heartbeat sets
(``RunControl``), the kind's limits, the running time used and the money
spent, and a saga's rollback mode. ``before_step`` is the check; the step
recorder (``workers.recording``) reports the money each checkpoint leaves
the run with (``spent``) and counts model calls (``count_model_call``).
"""

from __future__ import annotations

import time
from decimal import Decimal
from typing import TYPE_CHECKING, Literal

from django.conf import settings

from workers.errors import LeaseLost, ReleaseReason, ReleaseRun, ReplayEnded, StopRun

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.registry import AgentKind
    from workers.host import Host, RunControl

# A saga's rollback (workers.saga): None, "replay" (replaying to learn the
# compensations: no step may run) or "compensate" (running them).
Rollback = Literal["replay", "compensate"] | None


class RunBounds:
    """The lease, the requests and the bounds every step of one execution is checked against."""

    def __init__(
        self, *, claimed: ClaimedRun, worker: Host, control: RunControl, kind: AgentKind
    ) -> None:
        self._claimed = claimed
        self._worker = worker
        self._control = control
        self._kind = kind
        self._model_steps = 0
        # What the run spent, with what its finished children spent: its ceiling bounds both.
        self._cost = Decimal(claimed.cost_cents) + Decimal(claimed.children_cost_cents)
        self._claimed_clock = time.monotonic()
        self._rollback: Rollback = None
        if claimed.cancel_requested:
            control.cancel_requested.set()
        if claimed.pause_requested:
            control.pause_requested.set()

    @property
    def claim(self) -> ClaimedRun:
        return self._claimed

    @property
    def worker(self) -> Host:
        return self._worker

    @property
    def kind(self) -> AgentKind:
        return self._kind

    # The lease and people's requests.
    @property
    def cancelled(self) -> bool:
        """A cancel was requested or the lease was lost (during a rollback's compensations: only the lease)."""
        if self._rollback == "compensate":
            return self._control.lease_lost.is_set()
        return self._control.cancel_requested.is_set() or self._control.lease_lost.is_set()

    def lose_lease(self, message: str) -> LeaseLost:
        """Note that the lease is lost (the run is someone else's now) and return the error to raise."""
        self._control.lease_lost.set()
        return LeaseLost(message)

    def note_flags(self, cancel: bool, pause: bool) -> None:
        """The cancel and pause requests as a statement just read them."""
        self._control.note(cancel=cancel, pause=pause)

    # Money.
    @property
    def cost(self) -> Decimal:
        """What the run and its finished children spent so far."""
        return self._cost

    def spent(self, cost: Decimal) -> None:
        """The run's cost as the statement that recorded a step answered it."""
        self._cost = cost

    @property
    def budget_left_cents(self) -> Decimal | None:
        ceiling = self._claimed.cost_ceiling_cents
        return None if ceiling is None else max(Decimal(0), Decimal(ceiling) - self._cost)

    def count_model_call(self) -> None:
        self._model_steps += 1

    # A saga's rollback.
    @property
    def rollback(self) -> Rollback:
        return self._rollback

    def set_rollback(self, mode: Rollback) -> None:
        self._rollback = mode

    def replay_ends_here(self) -> None:
        """While replaying to roll back, the first step that did not finish ends the replay."""
        if self._rollback == "replay":
            raise ReplayEnded("the replay reached a step that did not finish")

    # The check before a step.
    def before_step(self, seq: int, kind: str) -> None:
        """A new step starts only while the run is still ours, wanted, and within its bounds."""
        self.replay_ends_here()
        if self._control.lease_lost.is_set():
            raise LeaseLost("lease lost")
        if not self._worker.lease_is_fresh():
            # Heartbeats have failed for lease - heartbeat seconds: another
            # worker may own the run soon, so start nothing new.
            raise self.lose_lease("heartbeats failing; not starting a new step")
        if self._rollback == "compensate":
            # A rollback runs to its end: not stopped by the cancel or the
            # bound that started it, only released by a shutdown.
            if self._worker.stopping.is_set():
                raise ReleaseRun(ReleaseReason.SHUTDOWN, "worker shutting down")
            return
        if self._control.cancel_requested.is_set():
            raise ReleaseRun(ReleaseReason.CANCEL_REQUESTED, "cancel requested")
        if self._control.pause_requested.is_set():
            raise ReleaseRun(ReleaseReason.PAUSE_REQUESTED, "pause requested")
        if self._worker.stopping.is_set():
            raise ReleaseRun(ReleaseReason.SHUTDOWN, "worker shutting down")
        if seq > self._kind.max_steps:
            raise StopRun(
                "step_limit", f"the run reached its limit of {self._kind.max_steps} steps"
            )
        if kind == "llm" and self._model_steps > self._kind.max_model_iterations:
            raise StopRun(
                "step_limit",
                f"the run reached its limit of {self._kind.max_model_iterations} model calls",
            )
        if self.deadline_left() <= 0:
            raise StopRun("deadline", self.deadline_message())
        self.check_budget()

    def check_budget(self) -> None:
        if self._rollback:
            return  # compensations run even when the money ran out
        ceiling = self._claimed.cost_ceiling_cents
        if ceiling is not None and self._cost > ceiling:
            raise StopRun(
                "budget", f"the run cost {self._cost:.6f}¢, over its ceiling of {ceiling}¢"
            )

    def deadline_left(self) -> float:
        """Seconds of running time the run has left."""
        used = self._claimed.running_seconds + (time.monotonic() - self._claimed_clock)
        return self._claimed.deadline_seconds - used

    def deadline_message(self) -> str:
        return f"the run used its {self._claimed.deadline_seconds} s of running time (deadline)"

    def timeout(self, requested: float | None) -> float:
        """A step's timeout: ``requested``, else the kind's, else the setting; cut to the deadline left."""
        timeout = requested or self._kind.step_timeout or settings.RUNS_STEP_TIMEOUT_SECONDS
        return max(0.001, min(timeout, self.deadline_left()))
