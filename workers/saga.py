"""Rolling a saga back: compensations of the finished steps, newest first, each a recorded step.

The executor starts a rollback when a run fails for good on an error its
kind lists in ``compensate_on`` (its context knows the compensations of the
steps it ran or replayed), and resumes one when it claims a run whose
``compensation`` is ``running``: it then replays the agent function with no
step allowed to run (``ctx.set_rollback("replay")``) to learn them, and
carries the recorded plan on (``runs.engine.saga``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runs.db import release_connection
from runs.engine import saga
from runs.engine.steplog import RecordedStep
from workers.errors import ParkForHuman

if TYPE_CHECKING:
    from workers.context import RunContext
    from workers.steplog import StepLog


@dataclass(frozen=True)
class RolledBack:
    plan: saga.RollbackPlan
    undone: list[int]
    not_undone: list[int]

    @property
    def compensation(self) -> str:
        return "partial" if self.not_undone else "done"

    def error(self) -> str:
        names = {entry["seq"]: entry["name"] for entry in self.plan.plan}
        said = [f"rolled back: {_steps(self.undone, names) or 'nothing to undo'}"]
        if self.not_undone:
            said.append(f"not undone: {_steps(self.not_undone, names)}")
        head = self.plan.error or (
            "cancelled with rollback" if self.plan.target == "cancelled" else ""
        )
        return f"{head}\n\n{'; '.join(said)}".strip()


def _steps(seqs: list[int], names: dict[int, str]) -> str:
    return ", ".join(f"{names.get(seq, 'step')} (step {seq})" for seq in seqs)


def recorded_plan(log: StepLog) -> saga.RollbackPlan | None:
    """The rollback plan in a run's step log, if a rollback began."""
    for step in log.newest_first():
        if (
            step.kind == "compensation"
            and step.name == saga.ROLLBACK_STEP
            and step.status == "done"
        ):
            return saga.RollbackPlan.from_step(step.seq, step.output)
    return None


class Rollback:
    def __init__(self, ctx: RunContext):
        self.ctx = ctx

    def begin(self, *, target: str, reason: str, error: str, error_kind: str) -> saga.RollbackPlan:
        """Record the plan: every finished step with a compensation, newest first."""
        ctx, log = self.ctx, self.ctx.step_log
        # After the run's last step: the steps it did not reach yet keep their positions.
        position = log.take_at(log.end + 1, saga.ROLLBACK_STEP, what="rollback")
        plan = saga.RollbackPlan(
            seq=position.seq,
            plan=[{"seq": c.seq, "name": c.name} for c in ctx.compensations],
            target=target,
            reason=reason,
            error=error,
            error_kind=error_kind,
        )
        try:
            began = saga.begin_rollback(
                run_id=ctx.run_id,
                token=ctx.claim.lease_token,
                generation=ctx.generation,
                plan=plan,
                worker_id=ctx.worker_id,
            )
        finally:
            release_connection()
        if not began:
            raise ctx.lose_lease("lease lost while starting the rollback")
        log.note(
            RecordedStep(
                seq=position.seq,
                name=saga.ROLLBACK_STEP,
                status="done",
                output=plan.as_output(),
                kind="compensation",
            )
        )
        return plan

    def run(self, plan: saga.RollbackPlan) -> RolledBack:
        """Run each compensation not recorded yet. A failing one raises, as a failing step does."""
        ctx, log = self.ctx, self.ctx.step_log
        ctx.set_rollback("compensate")
        for offset, entry in enumerate(plan.plan, start=1):
            seq, name = entry["seq"], entry["name"]
            recorded = log.recorded(plan.seq + offset)
            if recorded is not None and recorded.status == "done":
                continue  # undone already (or skipped, or marked done, by a person)
            compensator = ctx.compensation_of(seq)
            if compensator is None:
                raise ParkForHuman(
                    f"the compensation of step {seq} ({name}) was not found when the run was replayed "
                    "(did the code change?): retry it, skip it or mark it done"
                )
            key = f"{compensator.key or f'{ctx.run_id}:{ctx.generation}:{seq}'}:undo"
            ctx.execute_step(
                f"undo {name}",
                compensator.fn,
                (compensator.output,),
                {},
                at=log.take_at(plan.seq + offset, f"undo {name}", what="compensation"),
                side_effect=True,
                idempotency_key=key,
                kind="compensation",
                input={"compensates": seq, "name": name},
                compensates=seq,
            )
        seqs = [entry["seq"] for entry in plan.plan]
        try:
            left = saga.not_undone(run_id=ctx.run_id, generation=ctx.generation, seqs=seqs)
        finally:
            release_connection()
        return RolledBack(plan=plan, undone=[s for s in seqs if s not in left], not_undone=left)
