"""What a running run records of its finished steps, each write one fenced statement (reads: ``steplog``).

A step that has not finished yet (written ahead of its side effect, shown as
started, waiting for an approval) and a progress message: ``runs.engine.marks``.

Every write here is guarded by ``status = 'running' AND lease_token =
<mine>`` on the run row and writes the step, the run's progress and money,
and the Event together, or nothing at all: a worker that lost its lease
records nothing. Money also goes to the tenant's spend of the day (the
daily cost cap reads it in the claim). Step names, inputs, outputs and
errors are untrusted text (models and tools write them): they are made
storable on the way in (``runs.db.dumps_storable``), and the step says so.
The statements are in ``runs/sql/steps.sql``.

The lock order (``LOCK_IN_ORDER``): every statement that writes several
runs locks their rows in one order, the primary key's, before it writes
them, then tenant rows by id, then kinds' and queues' by name, so that two
such statements over the same rows (the committer's checkpoints and exits,
the claim, the reaper, another worker's committer) queue one behind the
other instead of deadlocking. A transaction of several such statements
locks all its runs in the first: the committer's checkpoints lock the runs
of the exits committed with them (``checkpoint_many(lock=...)``). The
counters many writers share (tenants, and kinds and queues under a global
limit) are locked in one statement and written in the next of the same
transaction, never both in one (``runs/sql/claim.sql`` says why).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple
from uuid import UUID

from runs import payloads
from runs.db import dumps_storable, engine_cursor, storable_text
from runs.engine import recordset
from runs.queries import one, queries, rows
from runs.states import RunStatus


@dataclass
class StepRecord:
    run_id: UUID
    token: int
    generation: int
    seq: int
    name: str
    kind: str
    input: Any
    started_at: datetime
    idempotency_key: str = ""
    tokens_in: int = 0
    tokens_out: int = 0
    cost_cents: Decimal = Decimal(0)
    # Set when the step's name, input or output held characters that cannot
    # be stored (NUL, lone surrogates) and were replaced by U+FFFD.
    text_replaced: bool = False
    # A compensation names the step it undoes: its checkpoint marks that one compensated.
    compensates: int | None = None

    def params(self) -> dict[str, Any]:
        """The step's columns as named parameters of the statements of ``runs/sql/steps.sql``."""
        name = storable_text(self.name)
        input_json, replaced = dumps_storable(self.input)
        self.text_replaced = self.text_replaced or replaced or name != self.name
        return {
            "run": self.run_id,
            "token": self.token,
            "generation": self.generation,
            "seq": self.seq,
            "name": name,
            "kind": self.kind,
            "input": payloads.stored_step_input_json(input_json, run_id=self.run_id, seq=self.seq),
            "key": storable_text(self.idempotency_key),
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
            "cost": self.cost_cents,
            "started_at": self.started_at,
            "text_replaced": self.text_replaced,
            "compensates": self.compensates,
        }


# The run guard of the statements of the other engine modules that still
# build their text here (runs/sql/fragments.sql has it as run_guard).


@recordset.row_of(queries.checkpoint)
@dataclass(frozen=True, kw_only=True)
class Checkpoint(recordset.Row):
    """A finished step to record, as stored: one row of the checkpoint statements (``Checkpoint.of``).

    Its fields up to ``steps_total`` are the columns of ``p`` in
    ``runs/sql/steps.sql`` (the fragment ``checkpoint_step``), in their
    order and of their types (checked at import, ``recordset.row_of``): the
    step's identity, name, kind, input and ``output`` (JSON text, storable:
    what replay will return), idempotency ``key``, tokens, ``cost``, when it
    started, whether text was replaced, and the run's ``steps_total``. The
    others are Python's: the messages a message step consumed and the step a
    compensation undid (for the statement of a single step), and
    ``returned``, the whole output's JSON, which the step returns, where
    ``output`` may be the reference to an artifact holding it
    (``runs.payloads``).
    """

    run: UUID
    token: int
    generation: int
    seq: int
    name: str
    kind: str
    input: str
    output: str
    key: str
    tokens_in: int
    tokens_out: int
    cost: Decimal
    started_at: datetime
    text_replaced: bool
    steps_total: int | None
    message_ids: tuple[int, ...] = field(default=(), metadata=recordset.PYTHON_ONLY)
    compensates: int | None = field(default=None, metadata=recordset.PYTHON_ONLY)
    returned: str = field(default="", metadata=recordset.PYTHON_ONLY)

    @classmethod
    def of(
        cls,
        step: StepRecord,
        *,
        output: Any,
        steps_total: int | None,
        consumed_message_ids: Iterable[int] = (),
    ) -> Checkpoint:
        """``step`` finished with ``output``; raises TypeError when the output is not JSON (nothing can be written).

        An output over the inline limit is saved as the run's artifact first
        (``runs.payloads``); past the hard cap raises ``PayloadTooLarge``.

        ``consumed_message_ids`` are the messages a ``message`` step read:
        consumed with its checkpoint. A compensation (``step.compensates``)
        consumes none.
        """
        output_json, replaced = dumps_storable(output)
        step.text_replaced = step.text_replaced or replaced
        params = step.params()
        message_ids = tuple(consumed_message_ids)
        if message_ids and step.compensates is not None:
            raise ValueError("a compensation consumes no messages")
        # The step's own columns as its statements' other parameters name them (StepRecord.params).
        own = {name: params[name] for name in cls.COLUMNS if name in params}
        return cls(
            **own,
            output=payloads.stored_step_output_json(output_json, step=step),
            returned=output_json,
            steps_total=steps_total,
            message_ids=message_ids,
            compensates=step.compensates,
        )

    @property
    def batchable(self) -> bool:
        """Whether it can be written with other runs' checkpoints in one statement (``checkpoint_many``).

        A step that consumes messages or undoes a step has a statement of its own.
        """
        return not self.message_ids and self.compensates is None

    def statement(self) -> str:
        if self.message_ids:
            return queries.checkpoint_consuming_messages
        if self.compensates is not None:
            return queries.checkpoint_compensation
        return queries.checkpoint


class Checkpointed(NamedTuple):
    """A checkpoint's answer: the run's flags and money as the checkpoint left them, and the output as stored."""

    cancel: bool  # a cancel was requested
    pause: bool  # a pause was requested
    spent: Decimal  # the run's cost, its finished children's included
    output: str  # the whole output, in JSON, as stored or as its artifact holds it


def _execute(
    statement: str,
    items: Sequence[Checkpoint],
    *,
    worker_id: UUID,
    lease: float,
    lock: Iterable[UUID] = (),
    message_ids: tuple[int, ...] = (),
    compensates: int | None = None,
) -> list[Checkpointed | None]:
    runs = [item.run for item in items]
    params: dict[str, Any] = {
        "rows": recordset.rows(items),
        "run": runs,
        "lock": list({*runs, *lock}),
        "running": RunStatus.RUNNING.value,
        "lease": lease,
        "worker": worker_id,
        "message_ids": list(message_ids),
        "compensates": compensates,
    }
    with engine_cursor() as cursor:
        cursor.execute(statement, params)
        found = {row["id"]: row for row in rows(cursor)}
    answers: list[Checkpointed | None] = []
    for item in items:
        row = found.get(item.run)
        answers.append(
            None
            if row is None
            else Checkpointed(
                cancel=row["cancel"], pause=row["pause"], spent=row["spent"], output=item.returned
            )
        )
    return answers


def checkpoint(item: Checkpoint, *, worker_id: UUID, lease: float) -> Checkpointed | None:
    """Record a finished step with the run's progress, cost and lease extension, in one statement.

    Returns the run's flags and cost (its finished children's included) and
    the output as stored, or None when the lease is lost, in which case
    nothing at all was written.
    """
    return _execute(
        item.statement(),
        [item],
        worker_id=worker_id,
        lease=lease,
        message_ids=item.message_ids,
        compensates=item.compensates,
    )[0]


def checkpoint_many(
    items: Sequence[Checkpoint], *, worker_id: UUID, lease: float, lock: Iterable[UUID] = ()
) -> list[Checkpointed | None]:
    """Record finished steps of different runs, in one statement: what ``checkpoint`` does for each.

    For batchable checkpoints (``Checkpoint.batchable``). The answers are in
    the items' order, None for a run whose lease is lost (nothing of it was
    written; the others are).

    ``lock`` names other runs the caller's transaction writes next (the
    exits the committer commits with these checkpoints): their rows are
    locked with the steps' runs, all in id order (``LOCK_IN_ORDER``).
    """
    if len({item.run for item in items}) != len(items):
        raise ValueError("checkpoint_many takes one step per run")
    if not all(item.batchable for item in items):
        raise ValueError("a checkpoint that consumes messages or undoes a step is written alone")
    return _execute(queries.checkpoint, items, worker_id=worker_id, lease=lease, lock=lock)


def record_step_failure(
    step: StepRecord, *, error: str, error_kind: str, worker_id: UUID, status: str = "failed"
) -> Decimal | None:
    """Record a failed execution (Step row, StepAttempt, Event, cost).

    ``status`` is ``failed``, or ``waiting`` for an ambiguous side effect a
    person must decide. Returns the run's cost, or None when the lease is lost.
    """
    error_text = storable_text(error) or ""
    step.text_replaced = step.text_replaced or error_text != error
    with engine_cursor() as cursor:
        cursor.execute(
            queries.record_step_failure,
            step.params()
            | {
                "error": error_text,
                "error_kind": error_kind,
                "worker": worker_id,
                "status": status,
            },
        )
        row = one(cursor)
    return None if row is None else row["spent"]
