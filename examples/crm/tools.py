"""The tools the ``crm_update`` agent works with: read a lead, write an update (idempotent, approved first).

The person who approves an update sees what it changes: ``describe_update``
reads the lead's current stage when the call is proposed. Each reads and
writes only the leads of the run's own tenant (``ctx.tenant_id``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from examples.crm import services
from examples.crm.services import LeadNotFound
from workers.errors import Fatal
from workers.llm.tools import ToolError, tool
from workers.proposals import Change, Proposal

if TYPE_CHECKING:
    from workers.context import RunContext

StageName = Literal["new", "contacted", "qualified", "proposal", "won", "lost"]


def _lead(ctx: RunContext, lead_id: int):
    try:
        return services.get_lead(tenant_id=ctx.tenant_id, lead_id=lead_id)
    except LeadNotFound as exc:
        raise ToolError(str(exc)) from None


@tool
def get_lead(ctx: RunContext, lead_id: int) -> dict:
    """Read a lead of the CRM: name, company, email, stage and notes."""
    return _lead(ctx, lead_id).as_dict()


def describe_update(
    ctx: RunContext, lead_id: int, stage: StageName | None = None, note: str = ""
) -> Proposal:
    """What an update would do ("Update lead Ana Lopez (Acme)"): the stage from its current value, the note added."""
    lead = _lead(ctx, lead_id)
    changes = []
    if stage is not None and stage != lead.stage:
        changes.append(Change("stage", lead.stage, stage))
    if note.strip():
        # Added as a new dated line: the notes already there stay.
        changes.append(Change("note", None, note.strip()))
    if not changes:
        raise ToolError(
            f"nothing to update: lead {lead_id} is already at stage {lead.stage} and no note was given"
        )
    return Proposal(
        summary=f"Update lead {lead}", target=f"Lead {lead.pk} ({lead.email})", changes=changes
    )


@tool(side_effect=True, needs_approval=True, propose=describe_update)
def update_lead(
    ctx: RunContext, lead_id: int, stage: StageName | None = None, note: str = ""
) -> dict:
    """Change a lead's stage and/or add a dated note. A person approves every update before it is written."""
    if stage is None and not note.strip():
        raise ToolError("nothing to update: give a stage, a note, or both")
    key = ctx.idempotency_key
    if (
        not key
    ):  # the loop runs side-effect tools as keyed steps; anything else is a programming error
        raise Fatal("update_lead must run as a step with an idempotency key")
    try:
        update = services.apply_lead_update(
            tenant_id=ctx.tenant_id,
            lead_id=lead_id,
            stage=stage,
            note=note.strip(),
            idempotency_key=key,
            run_id=ctx.run_id,
        )
    except LeadNotFound as exc:
        raise ToolError(str(exc)) from None
    return update.as_dict()
