"""A saga's rollback (docs/how-to/sagas.md): the recorded decision to roll back, and what it left undone.

A rollback begins with one fenced statement that records its plan as a
``compensation`` step named ``rollback`` after the run's last step (the
steps to undo, newest first; why; and how the run ends: ``failed`` or
``cancelled``) and sets the run's ``compensation`` to ``running``. Each
compensation is then a recorded step after it, written ahead of its effect
with an idempotency key derived from the step it undoes; its checkpoint
marks that step ``compensated`` (``runs.engine.steps``). A worker that
claims a run whose compensation is ``running`` replays the run to learn the
compensations and carries the plan on from the first one not recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection

from runs.db import dumps
from runs.queries import one, queries, rows

ROLLBACK_STEP = "rollback"


@dataclass(frozen=True)
class RollbackPlan:
    seq: int  # the plan's own step; compensation i (from 1) is step seq + i
    plan: list[dict[str, Any]]  # {"seq", "name"} of each step to undo, newest first
    target: str  # failed | cancelled
    reason: str
    error: str
    error_kind: str

    def as_output(self) -> dict[str, Any]:
        return {
            "plan": self.plan,
            "target": self.target,
            "reason": self.reason,
            "error": self.error,
            "error_kind": self.error_kind,
        }

    @classmethod
    def from_step(cls, seq: int, output: dict[str, Any]) -> RollbackPlan:
        return cls(
            seq=seq,
            plan=list(output["plan"]),
            target=output["target"],
            reason=output.get("reason", ""),
            error=output.get("error", ""),
            error_kind=output.get("error_kind", ""),
        )


def begin_rollback(
    *, run_id: UUID, token: int, generation: int, plan: RollbackPlan, worker_id: UUID
) -> bool:
    """Record the rollback's plan and mark the run as rolling back. False when the lease is lost."""
    with connection.cursor() as cursor:
        cursor.execute(
            queries.begin_rollback,
            {
                "run": run_id,
                "token": token,
                "generation": generation,
                "seq": plan.seq,
                "name": ROLLBACK_STEP,
                "output": dumps(plan.as_output()),
                "error": plan.error,
                "error_kind": plan.error_kind,
                "reason": plan.reason,
                "target": plan.target,
                "worker": worker_id,
            },
        )
        return one(cursor) is not None


def not_undone(*, run_id: UUID, generation: int, seqs: list[int]) -> list[int]:
    """Which of these steps are still ``done``: their compensation was skipped (or never ran)."""
    with connection.cursor() as cursor:
        cursor.execute(queries.not_undone, {"run": run_id, "generation": generation, "seqs": seqs})
        return [row["seq"] for row in rows(cursor)]
