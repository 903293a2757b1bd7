"""The values the authoring API exchanges with agent code (re-exported by ``workers`` where public).

``StepResult`` is what a step function may return; ``Decision`` is a
person's answer to ``ctx.approval``; ``ChildRun`` is the handle ``ctx.spawn``
returns and ``ChildOutcome`` what ``ctx.gather`` says of each child. Each is
rebuilt from the step's recorded JSON on replay (``from_output``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from runs import payloads


@dataclass(frozen=True)
class StepResult:
    """What a step function may return instead of plain data: its output plus usage and cost.

    ``output`` is what the step returns and records (JSON data);
    ``tokens_in``, ``tokens_out`` and ``cost_cents`` are added to the
    step's and the run's totals, which the run's cost ceiling bounds.
    """

    output: Any
    tokens_in: int = 0
    tokens_out: int = 0
    cost_cents: Decimal | float | int = 0


@dataclass(frozen=True)
class Decision:
    """A person's answer to ``ctx.approval``.

    ``approved`` is their decision and ``comment`` what they wrote with it;
    ``by`` says who decided (``user:7``, ``api_key:3``) and ``by_name`` how
    they were named then; ``at`` is when.
    """

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
class ChildRun:
    """A handle on a child run made by ``ctx.spawn``; pass it to ``ctx.gather``."""

    run_id: UUID
    kind: str
    key: str

    @classmethod
    def from_output(cls, output: dict) -> ChildRun:
        return cls(run_id=UUID(output["run_id"]), kind=output["kind"], key=output["key"])


@dataclass(frozen=True)
class ChildOutcome:
    """What ``ctx.gather`` says of one child: its status, and its result or error.

    ``status`` is ``done``, ``failed`` or ``cancelled`` (by a person, or
    because the gather no longer needed it); ``succeeded`` is True for
    ``done``. ``result`` is the child's result, ``error`` and ``error_kind``
    say why it failed.
    """

    run_id: UUID
    kind: str
    status: str  # done | failed | cancelled (by a person, or a straggler the gather cancelled)
    result: Any
    error: str
    error_kind: str

    @property
    def succeeded(self) -> bool:
        return self.status == "done"

    @classmethod
    def from_output(cls, output: dict, *, parent_id: UUID) -> ChildOutcome:
        """The outcome a gather recorded; a result stored as an artifact is read back (``runs.payloads``)."""
        return cls(
            run_id=UUID(output["run_id"]),
            kind=output["kind"],
            status=output["status"],
            result=payloads.resolve(output.get("result"), run_id=parent_id),
            error=output.get("error", ""),
            error_kind=output.get("error_kind", ""),
        )
