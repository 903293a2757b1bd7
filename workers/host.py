"""What one run's execution shares with the worker process that runs it.

``Host`` is what executing a run needs of its worker (``workers.worker.Worker``
provides it; tests provide a small one); ``RunControl`` carries the flags the
worker's heartbeat and listener set for one executing run (cancel, pause, a
lost lease) to the run's thread.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import TYPE_CHECKING, Protocol
from uuid import UUID

if TYPE_CHECKING:
    from workers.committer import Committer


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
