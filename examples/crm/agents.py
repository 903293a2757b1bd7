"""The CRM demo's agent kind: ``crm_update`` reads a lead, proposes one update, waits for a person's
approval and writes it idempotently. With a provider configured (``LLM_BASE_URL``) a real model drives
it; without one, ``crm_script`` plays the model deterministically, so ``make run`` works offline.
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, Field

from examples.crm.tools import get_lead, update_lead
from runs.registry import agent
from runs.states import RunOutcome
from workers.context import RunContext
from workers.llm import run_agent_loop
from workers.llm.scripts import json_or_none, last_turn, user_field

CRM_USER = "Lead id: {lead_id}\nInstruction: {instruction}"

CRM_SYSTEM = (
    "You keep a CRM up to date. Read the lead with get_lead, then propose exactly one update with update_lead "
    "that reflects the instruction: a stage change if the instruction implies one, and a short factual note. "
    "A person approves the update before it is written. Finish with one sentence saying what changed."
)


# Words in an instruction that say which stage a lead moves to, strongest first.
STAGE_WORDS = [
    ("won", ("won", "signed", "closed the deal", "bought")),
    ("lost", ("lost", "declined", "rejected", "went with a competitor")),
    ("proposal", ("proposal", "offer", "quote")),
    ("qualified", ("qualified", "qualify", "budget confirmed")),
    ("contacted", ("contacted", "called", "emailed", "met ", "spoke")),
]


class CrmUpdateIn(BaseModel):
    lead_id: int = Field(default=1, ge=1, description="The lead to update")
    instruction: str = Field(
        min_length=3,
        max_length=2000,
        description="What happened, e.g. 'They signed the contract today'",
    )


def what_happened(lead_id: int, calls: list[dict], *, answer: str) -> tuple[str, RunOutcome]:
    """The run's summary and outcome, from the tool calls the model made (not from its words)."""
    read = next(
        (json_or_none(c["content"]) for c in calls if c["name"] == "get_lead" and not c["error"]),
        None,
    )
    lead = f"lead {lead_id}"
    if isinstance(read, dict) and read.get("name"):
        lead = str(read["name"]) + (f" ({read['company']})" if read.get("company") else "")
    applied = next((c for c in calls if c["name"] == "update_lead" and not c["error"]), None)
    if applied is not None:
        update = json_or_none(applied["content"])
        changes = update.get("changes", {}) if isinstance(update, dict) else {}
        if "stage" in changes:
            noted = " and added a note" if "note" in changes else ""
            return f"Moved {lead} to {changes['stage']}{noted}", RunOutcome.SUCCEEDED
        return f"Added a note to {lead}", RunOutcome.SUCCEEDED
    if any(c["name"] == "update_lead" and c.get("approved") is False for c in calls):
        return (
            f"The update of {lead} was rejected by a person: nothing was written",
            RunOutcome.UNCHANGED,
        )
    if read is None and any(c["name"] == "get_lead" and c["error"] for c in calls):
        return f"Lead {lead_id} was not found: nothing was written", RunOutcome.UNCHANGED
    return f"Nothing was written to {lead}: {answer}".rstrip(": "), RunOutcome.UNCHANGED


def stage_for(instruction: str) -> str | None:
    text = f" {instruction.lower()} "
    for stage, words in STAGE_WORDS:
        if any(word in text for word in words):
            return stage
    return None


def crm_script(messages: list[dict], tools: list[dict]) -> dict:
    """Read the lead, propose one update from the instruction, then report what happened."""
    lead_id = int(re.sub(r"\D", "", user_field(messages, "Lead id")) or 0)
    instruction = user_field(messages, "Instruction")
    called, results = last_turn(messages)
    if not called:
        return {
            "content": "Reading the lead first.",
            "tool_calls": [{"name": "get_lead", "arguments": {"lead_id": lead_id}}],
        }
    outcome = results[-1].get("content", "") if results else ""
    if "get_lead" in called:
        lead = json_or_none(outcome)
        if not isinstance(lead, dict):
            return {"content": f"I could not read lead {lead_id}: {outcome}"}
        arguments: dict = {"lead_id": lead_id, "note": instruction}
        stage = stage_for(instruction)
        if stage and stage != lead.get("stage"):
            arguments["stage"] = stage
        change = (
            f"move it from {lead.get('stage')} to {stage}"
            if "stage" in arguments
            else "keep its stage"
        )
        return {
            "content": f"I propose to {change} and add the note: {instruction}",
            "tool_calls": [{"name": "update_lead", "arguments": arguments}],
        }
    if "update_lead" in called:
        update = json_or_none(outcome)
        if not isinstance(update, dict):
            return {"content": f"The update of lead {lead_id} was not applied. {outcome}"}
        changes = update.get("changes", {})
        parts = (
            [f"stage {update['previous'].get('stage')} → {changes['stage']}"]
            if "stage" in changes
            else []
        )
        if "note" in changes:
            parts.append("note added")
        return {"content": f"Updated lead {lead_id}: {', '.join(parts) or 'nothing changed'}."}
    return {"content": "Done."}


# Version 2 proposes through a recorded "Proposing update_lead" step (before/after values), which moved
# the later steps: runs recorded by version 1 finish on workers that still run it.
@agent(
    "crm_update",
    input_schema=CrmUpdateIn,
    max_attempts=3,
    max_model_iterations=8,
    version=2,
    title=lambda data: f"Lead {data['lead_id']}: {data['instruction']}",
)
def crm_update(ctx: RunContext, data: CrmUpdateIn) -> dict:
    """Read a CRM lead, propose an update from an instruction, wait for approval, then write it (idempotently)."""
    result = run_agent_loop(
        ctx,
        system=CRM_SYSTEM,
        user=CRM_USER.format(lead_id=data.lead_id, instruction=data.instruction),
        tools=[get_lead, update_lead],
        max_iterations=6,
        script=crm_script,
    )
    applied = next(
        (c for c in result.tool_calls if c["name"] == "update_lead" and not c["error"]), None
    )
    summary, outcome = what_happened(data.lead_id, result.tool_calls, answer=result.answer)
    ctx.report(summary, outcome=outcome)
    return {
        "lead_id": data.lead_id,
        "applied": applied is not None,
        "update": json.loads(applied["content"]) if applied else None,
        "summary": result.answer,
        "iterations": result.iterations,
        "model": result.model,
    }
