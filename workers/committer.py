"""Group commit: every engine write of a worker's runs (checkpoints and exits) goes through here.

A run's thread hands its finished step (a ``Checkpoint``) or its exit (an
``Exit``) to ``Committer.commit`` and waits until it is committed: the rule
does not change, a step's checkpoint is durable before the next step
starts. What changes is that the runs of a worker that finish a step while a
commit is under way are written together, in one statement of each kind and
one commit, instead of one statement and one WAL flush each
(``runs.engine.steps.checkpoint_many``, ``runs.engine.exit.leave_many``).
Nothing waits to fill a batch: a lone checkpoint is written at once, and
batches grow only under load.

Which writes are batched is decided here, in ``commit``, and nowhere else:
those the batched statements can say (``Checkpoint.batchable``,
``Exit.batchable``), while the committer's thread runs. The others (a
message step, a compensation, a child's exit, parking that re-checks its
wake-up), and every write of a worker whose loop is not running, are
written at once on the caller's thread, each in its own statement.

A batch that fails is rolled back and its requests are written one by one,
so that an error is raised to the run that caused it and no other (a
deadlock with another worker's claim on a tenant row, a value a column
refuses, a connection lost: each caller's own handling applies).
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from contextlib import nullcontext
from typing import Any, overload
from uuid import UUID

from django.db import transaction

from runs.db import release_connection
from runs.engine.exit import Exit, Exited, leave, leave_many
from runs.engine.steps import Checkpoint, Checkpointed, checkpoint, checkpoint_many
from workers.handoff import Signal

logger = logging.getLogger(__name__)

# At most this many requests per transaction: bounded statements, and a
# commit that lets the first ones go on soon.
MAX_BATCH = 100


class _Request:
    __slots__ = ("item", "done", "value", "error")

    def __init__(self, item: Checkpoint | Exit) -> None:
        self.item = item
        self.done = Signal()
        self.value: Any = None
        self.error: BaseException | None = None


_STOP = object()


def _release() -> None:
    # Never the end of the thread: a request handed over after it would wait forever.
    try:
        release_connection()
    except Exception:  # noqa: BLE001
        logger.exception("could not hand the committer's connection back")


class Committer:
    """Writes checkpoints and exits of a worker's runs, those that arrive together in one transaction."""

    def __init__(self, *, worker_id: UUID, lease: float) -> None:
        self.worker_id = worker_id
        self.lease = lease
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.batches = 0
        self.requests = 0

    def start(self) -> None:
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._serve,),
            name="committer",
            daemon=True,
        )
        self._thread.start()

    def stop(self) -> None:
        """Write what was handed over, then end the thread."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # What a run's thread calls: it returns once the write is committed (or raises its error).
    @overload
    def commit(self, write: Checkpoint) -> Checkpointed | None: ...
    @overload
    def commit(self, write: Exit) -> Exited | None: ...
    def commit(self, write: Checkpoint | Exit) -> Checkpointed | Exited | None:
        """Write a step's checkpoint or a run's exit; None when the run's lease is lost (nothing written).

        With the worker's other runs' writes when the batched statements can
        say it and the committer runs; otherwise at once, on this thread.
        """
        if write.batchable and self.running:
            return self._submit(_Request(write))
        if isinstance(write, Exit):
            return leave(write)
        return checkpoint(write, worker_id=self.worker_id, lease=self.lease)

    def _submit(self, request: _Request):
        self._queue.put(request)
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.value

    # The committer's thread.
    def _serve(self) -> None:
        try:
            while True:
                first = self._queue.get()
                if first is _STOP:
                    return
                batch = [first]
                stop = False
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is _STOP:
                        stop = True
                        break
                    batch.append(more)
                self._commit(batch)
                if stop:
                    return
                if self._queue.empty():
                    # Idle: its connection goes back to the pool, where a run's
                    # own statements may need it (a pool can be that small).
                    _release()
        finally:
            _release()

    def _commit(self, batch: list[_Request]) -> None:
        self.batches += 1
        self.requests += len(batch)
        if len(batch) > 1:
            try:
                values = self._write(batch)
            except BaseException:  # noqa: BLE001 - written one by one below, each raising its own error
                logger.debug(
                    "a batch of %s writes failed; writing them one by one",
                    len(batch),
                    exc_info=True,
                )
                _release()
            else:
                for request, value in zip(batch, values, strict=True):
                    request.value = value
                    request.done.set()
                return
        for request in batch:
            try:
                request.value = self._write([request])[0]
            except BaseException as exc:  # noqa: BLE001 - handed to the run's thread
                request.error = exc
                _release()  # a broken connection goes back to the pool to be discarded
            finally:
                request.done.set()

    def _write(self, batch: list[_Request]) -> list[Any]:
        checkpoints = [(r, r.item) for r in batch if isinstance(r.item, Checkpoint)]
        exits = [(r, r.item) for r in batch if isinstance(r.item, Exit)]
        with transaction.atomic() if len(batch) > 1 else nullcontext():
            # The checkpoints lock the exits' runs too, all in one order
            # (runs.engine.steps: the lock order): a heartbeat could deadlock with this transaction otherwise.
            done = (
                checkpoint_many(
                    [item for _, item in checkpoints],
                    worker_id=self.worker_id,
                    lease=self.lease,
                    lock=[exit.run for _, exit in exits if exit.run is not None],
                )
                if checkpoints
                else []
            )
            left = leave_many([exit for _, exit in exits]) if exits else []
        values: dict[int, Any] = {}
        for (request, _), checkpointed in zip(checkpoints, done, strict=True):
            values[id(request)] = checkpointed
        for (request, _), exited in zip(exits, left, strict=True):
            values[id(request)] = exited
        return [values[id(r)] for r in batch]
