"""Between an async agent framework and a run's thread: what the adapters of ``workers.frameworks`` share.

The frameworks (Pydantic AI, the OpenAI Agents SDK) are async, and ``ctx.step`` and
``ctx.approval`` belong to the run's own thread, the worker pool's thread that called the kind.
So a framework's coroutine runs on the process's event loop for frameworks (``event_loop()``: a
daemon thread of its own, shared by every run of the process, so that an async client made once
per process stays bound to a loop that lives), and the run's thread serves what the coroutine
asks of it (``Bridge``). Sync tools run on the loop's executor (``tool_threads()``), whose
threads hand their database connection back after each call, as the engine's threads do.

A typical adapter::

    bridge = Bridge(f"the agent of run {ctx.run_id}")

    async def model_call(request):
        def make_step():
            timeout = ctx.step_timeout()
            return ctx.step("Thinking", lambda: bridge.wait(lambda: model.request(request), timeout),
                            kind="llm", timeout=timeout)
        return await bridge.call(make_step)

    result = bridge.run(lambda: framework.run(agent, prompt))  # on the run's thread
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from runs.db import release_connection
from workers.step_thread import KEEP_CONNECTION_SECONDS

__all__ = ["Bridge", "event_loop", "tool_threads"]

logger = logging.getLogger(__name__)

# How long the run's thread waits for a framework coroutine it stopped (a suspension, a failed step) to end.
ABORT_GRACE_SECONDS = 5.0
# A step's thread waits this much longer than the step's timeout for the framework's coroutine, so that
# the engine's timeout (StepTimeout) fires first, and the wait still ends should nothing cancel it.
WAIT_MARGIN_SECONDS = 5.0
_FINISHED = object()


@dataclass
class _Call:
    """What the coroutine asks the run's thread to do, and where the answer goes."""

    fn: Callable[[], Any]
    answer: asyncio.Future


class Bridge:
    """One run's framework coroutine on the frameworks' event loop, and the run's thread doing what it asks.

    ``run(main)``, on the run's thread, starts ``main()`` on the loop and serves it until it ends:
    a coroutine awaits ``call(fn)``, and ``fn`` (which calls ``ctx.step`` or ``ctx.approval``) runs
    on the run's thread, one call at a time, in the order asked, so that a replay meets the steps in
    the same order. A step function, on the step's thread, awaits the framework's work there with
    ``wait(make, timeout)``, leaving the loop free for the process's other runs.

    Whatever ``fn`` raises (a failed step, a suspension: an approval, a release, a lost lease) ends
    this attempt, and the framework must not go on without it: the coroutine and the work it has
    in flight are cancelled, the run's thread waits (up to ``ABORT_GRACE_SECONDS``) for it to end,
    and ``run`` raises that same exception object, which the executor recognises as the step's
    (``ctx.last_failure.exc is exc``).
    """

    def __init__(self, what: str) -> None:
        self.what = what  # for the log: "the Pydantic AI agent of run ..."
        self.loop = event_loop()
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._outcome: concurrent.futures.Future = concurrent.futures.Future()
        self._task: asyncio.Task | None = None
        self._in_flight: set[concurrent.futures.Future] = set()  # coroutines that steps wait for
        # One call queued at a time: a call asked meanwhile, and cancelled meanwhile, never reaches the run's thread.
        self._order = asyncio.Lock()

    # On the run's thread.
    def run[T](self, main: Callable[[], Awaitable[T]]) -> T:
        """``await main()`` on the loop, doing what it asks on this thread; returns its value or raises its error."""
        context = contextvars.copy_context()  # the run's log fields, on the loop too

        def start() -> None:
            self._task = self.loop.create_task(_awaited(main), context=context)
            self._task.add_done_callback(self._finished)

        self.loop.call_soon_threadsafe(start)
        while (call := self._next_call()) is not _FINISHED:
            try:
                value = call.fn()
            except BaseException:
                self._abort()
                raise
            self.loop.call_soon_threadsafe(_settle, call.answer, value)
        return self._outcome.result()

    def _next_call(self) -> Any:
        try:
            return self._calls.get(timeout=KEEP_CONNECTION_SECONDS)
        except queue.Empty:
            release_connection()  # the framework works between steps: the run holds no connection meanwhile
            return self._calls.get()

    def _abort(self) -> None:
        """Stop the coroutine, and wait (a while) for it to end: what it still asks is cancelled, not done."""
        for future in list(self._in_flight):
            future.cancel()  # cancels its task on the loop
        assert self._task is not None  # a call came from it
        self.loop.call_soon_threadsafe(self._task.cancel)
        deadline = time.monotonic() + ABORT_GRACE_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            try:
                call = self._calls.get(timeout=left)
            except queue.Empty:
                break
            if call is _FINISHED:
                return
            self.loop.call_soon_threadsafe(call.answer.cancel)
        # Left to wind down on the loop by itself: nothing it asks is served any more.
        logger.warning("%s did not stop within %.0f s", self.what, ABORT_GRACE_SECONDS)

    # On the event loop.
    def _finished(self, task: asyncio.Task) -> None:
        if task.cancelled():
            self._outcome.cancel()
        elif (exc := task.exception()) is not None:
            self._outcome.set_exception(exc)
        else:
            self._outcome.set_result(task.result())
        self._calls.put(_FINISHED)

    async def call[T](self, fn: Callable[[], T]) -> T:
        """``fn()`` on the run's thread (the one in ``run``), after the calls asked before it; returns its value."""
        async with self._order:
            answer = asyncio.get_running_loop().create_future()
            self._calls.put(_Call(fn, answer))
            return await answer

    # On a step's thread.
    def wait[T](
        self,
        make: Callable[[], Awaitable[T]],
        timeout: float,
        *,
        context: contextvars.Context | None = None,
    ) -> T:
        """Run the coroutine ``make()`` on the loop and wait for its value, for up to ``timeout`` seconds (and a margin).

        It runs in a copy of ``context`` (by default this thread's, a step's: the step's log fields
        and trace span). Stopping the run cancels it.
        """
        if context is None:
            future = asyncio.run_coroutine_threadsafe(_awaited(make), self.loop)
        else:
            future = context.run(asyncio.run_coroutine_threadsafe, _awaited(make), self.loop)
        self._in_flight.add(future)
        try:
            return future.result(timeout + WAIT_MARGIN_SECONDS)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(
                f"the framework's call did not return within {timeout:g} s"
            ) from None
        finally:
            self._in_flight.discard(future)


def _settle(answer: asyncio.Future, value: Any) -> None:
    if not answer.done():  # not cancelled meanwhile
        answer.set_result(value)


async def _awaited[T](make: Callable[[], Awaitable[T]]) -> T:
    return await make()


# The process's event loop for frameworks, and the threads of their sync tools.

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_threads: concurrent.futures.ThreadPoolExecutor | None = None


def event_loop() -> asyncio.AbstractEventLoop:
    """The loop every run of this process runs its framework on: one, so that clients bound to it stay valid."""
    return _running()[0]


def tool_threads() -> concurrent.futures.ThreadPoolExecutor:
    """The loop's threads for sync tools: its default executor, so ``asyncio.to_thread`` uses them too."""
    return _running()[1]


def _running() -> tuple[asyncio.AbstractEventLoop, concurrent.futures.ThreadPoolExecutor]:
    global _loop, _threads
    with _lock:
        if _loop is None or _threads is None or not _loop.is_running():
            loop = asyncio.new_event_loop()
            # Each loop its own: closing a loop shuts its default executor down.
            threads = _ConnectionReleasingExecutor(thread_name_prefix="agentruns-framework-tool")
            loop.set_default_executor(threads)
            started = threading.Event()
            loop.call_soon(started.set)
            threading.Thread(
                target=loop.run_forever, name="agentruns-framework-loop", daemon=True
            ).start()
            started.wait()
            _loop, _threads = loop, threads
        return _loop, _threads


class _ConnectionReleasingExecutor(concurrent.futures.ThreadPoolExecutor):
    """Threads that hand their database connection back after each call: a tool may use the ORM."""

    def submit(self, fn, /, *args, **kwargs):
        return super().submit(_releasing, fn, args, kwargs)


def _releasing(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    try:
        return fn(*args, **kwargs)
    finally:
        release_connection()
