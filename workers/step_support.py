"""The pieces a run's execution shares between threads, and the values steps exchange.

``StepResult`` and ``Decision`` are part of the authoring API (re-exported
by ``workers``); ``RunControl`` carries flags from the worker's heartbeat to
one executing run; ``Host`` is what a run's execution needs of the worker
process that runs it; ``StepThread`` runs step functions so that a timeout
can be enforced.
"""

from __future__ import annotations

import queue as queue_module
import threading
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

from runs.db import release_connection
from workers.handoff import Signal

if TYPE_CHECKING:
    from workers.committer import Committer


@dataclass(frozen=True)
class StepResult:
    """What a step function may return instead of plain data: its output plus usage and cost."""

    output: Any
    tokens_in: int = 0
    tokens_out: int = 0
    cost_cents: Decimal | float | int = 0


@dataclass(frozen=True)
class Decision:
    """A person's answer to ``ctx.approval``."""

    approved: bool
    comment: str
    by: str  # "user:7", "api_key:3"
    at: datetime
    by_name: str = ""  # "Ana Lopez", "API key ‘ci-bot’", as named when they decided

    @classmethod
    def from_output(cls, output: dict) -> Decision:
        return cls(
            approved=bool(output["approved"]),
            comment=output.get("comment", ""),
            by=output.get("by", ""),
            at=datetime.fromisoformat(output["at"]),
            by_name=output.get("by_name", ""),
        )


@dataclass(frozen=True)
class StepFailure:
    """How the executor is to handle an exception a step raised."""

    exc: BaseException
    error_kind: str  # retryable | fatal | ambiguous
    retry_after: float | None
    seq: int
    name: str


class Host(Protocol):
    """What executing a run needs of the worker process it runs in (``workers.worker.Worker``)."""

    id: UUID
    lease: float
    poll: float
    stopping: threading.Event
    # True while the worker's claim loop runs: an exit then leaves the tenant
    # slot to be given back by the next claim (slot_returned).
    defers_slot_returns: bool
    # Writes checkpoints and exits of the worker's runs together (workers.committer), while it runs.
    committer: Committer

    def slot_returned(self, tenant_id: UUID, left_at: datetime) -> None:
        """A run of ``tenant_id`` left running at ``left_at`` keeping its slot: give it back with the next claim."""
        ...

    def lease_is_fresh(self) -> bool:
        """False once heartbeats have failed for long enough that no new step may start."""
        ...

    def watch_stuck_step(self, thread: threading.Thread, timeout: float) -> None:
        """A step outlived its timeout: watch its thread, and give the process up if it never returns."""
        ...

    def notify_released(self, run_queue: str) -> None:
        """A run went back to ``run_queue`` ready to run: wake the workers."""
        ...


class RunControl:
    """Flags shared between the worker's threads and one executing run."""

    def __init__(self) -> None:
        self.cancel_requested = threading.Event()
        self.pause_requested = threading.Event()
        self.lease_lost = threading.Event()
        # Set just before the run leaves running: a heartbeat that no longer
        # finds the lease then is not a lost lease.
        self.leaving = threading.Event()

    def note(self, *, cancel: bool, pause: bool) -> None:
        """The database's current requests: a cancel stays; a pause can be withdrawn."""
        if cancel:
            self.cancel_requested.set()
        if pause:
            self.pause_requested.set()
        else:
            self.pause_requested.clear()


class StepThread:
    """The thread that runs step functions for one of the worker's run threads.

    Steps run off the run's thread so that a timeout can be enforced; the
    thread is kept for the next step (starting one per step costs more than
    a no-op step). One that overran its timeout is abandoned to the
    worker's watchdog and replaced.
    """

    _local = threading.local()

    def __init__(self) -> None:
        self._tasks: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="step", daemon=True)
        self.thread.start()

    @classmethod
    def for_this_thread(cls) -> StepThread:
        runner = getattr(cls._local, "runner", None)
        if runner is None:
            runner = cls._local.runner = cls()
        return runner

    @classmethod
    def abandon_this_thread(cls) -> None:
        cls._local.runner = None

    def submit(self, fn, args, kwargs) -> tuple[dict[str, Any], Signal]:
        box: dict[str, Any] = {}
        finished = Signal()
        self._tasks.put((fn, args, kwargs, box, finished))
        return box, finished

    def _serve(self) -> None:
        while True:
            fn, args, kwargs, box, finished = self._tasks.get()
            try:
                box["value"] = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the run's thread
                box["error"] = exc
            finally:
                release_connection()  # step code may have used the ORM
                finished.set()
