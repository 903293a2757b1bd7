"""Where a step function runs: a thread of its own, under the step's timeout.

``call_step`` hands the function to this run thread's ``StepThread``, hands
the run's pooled connection back when the step is not quick, announces a
slow step, and gives up on one that outlives its timeout (its thread is
abandoned to the worker's watchdog). ``BETWEEN_STEPS`` says which run's
agent code is executing in a context between its steps
(``workers.context.current_run``).
"""

from __future__ import annotations

import contextvars
import queue as queue_module
import threading
import time
from collections.abc import Callable
from typing import Any

from runs.db import release_connection
from workers.errors import StepTimeout
from workers.handoff import Signal

# A step still running after this long is written as the run's current step.
ANNOUNCE_AFTER_SECONDS = 0.2
# How long a run keeps the pooled connection of its last checkpoint while
# its next step runs, so that a no-op step's checkpoint reuses it. A step
# still running after this hands it back: the pool has a dozen connections
# and a worker hundreds of runs, and keeping it until the announcement
# (0.2 s) capped a worker at pool size / 0.2 s = 60 slow steps started per
# second (bench/inflight.py).
KEEP_CONNECTION_SECONDS = 0.002

# The run whose kind code is executing in this context between its steps (set by the executor around
# the agent function), None inside a step and outside any run: workers.context.current_run().
BETWEEN_STEPS: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "agentruns_between_steps", default=None
)


def call_step(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict,
    *,
    name: str,
    timeout: float,
    announce: Callable[[], None],
    watch_stuck: Callable[[threading.Thread, float], None],
) -> Any:
    """Run ``fn`` on the step thread; ``announce()`` it when slow; give up on it after ``timeout``.

    Returns what ``fn`` returned or raises what it raised; raises
    ``StepTimeout`` when it did not return in time (``watch_stuck`` is then
    given its thread, which the next step does not reuse).
    """
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
        announce()
        if not finished.wait(max(0.0, timeout - (time.monotonic() - started))):
            StepThread.abandon_this_thread()  # the next step gets a fresh thread
            watch_stuck(runner.thread, timeout)
            raise StepTimeout(f"step {name!r} did not return within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


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
