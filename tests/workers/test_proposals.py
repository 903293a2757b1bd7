"""Approval proposals: one shape (summary, target, before/after changes, details) from the LLM loop and ctx.approval."""

from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from examples.crm.agents import crm_script
from examples.crm.models import Lead, LeadUpdate
from runs.control import approve_run
from runs.dashboard.rendering import proposal_view
from runs.models import Step
from runs.registry import agent
from runs.services import Actor, submit_run
from tests.support.fake_openai import drive, from_script, say
from workers import Change, Proposal, RunContext
from workers.llm import run_agent_loop, tool
from workers.proposals import UNKNOWN

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures

PERSON = Actor(type="user", id="42")


@tool(needs_approval=True)
def send_email(to: str, subject: str, urgent: bool = False) -> dict:
    """Send an email (a person approves it first)."""
    return {"sent": True, "to": to}


class MailIn(BaseModel):
    prompt: str = "Tell Ana the order shipped"


@agent("proposals_mail", input_schema=MailIn)
def proposals_mail(ctx: RunContext, data: MailIn) -> dict:
    """An LLM loop with one tool that needs approval and does not describe its calls."""
    return run_agent_loop(
        ctx, system="You send emails.", user=data.prompt, tools=[send_email]
    ).to_dict()


class RefundIn(BaseModel):
    order: int = 1042


@agent("proposals_refund", input_schema=RefundIn)
def proposals_refund(ctx: RunContext, data: RefundIn) -> dict:
    """Asks for approval with a Proposal, then acts."""
    decision = ctx.approval(
        "Refund the order",
        proposal=Proposal(
            f"Refund order {data.order}",
            target=f"Order {data.order} (ana@example.com)",
            changes=[
                Change("status", "paid", "refunded"),
                Change("balance", 120, 0),
                Change("reason", UNKNOWN, "damaged"),
            ],
            details={"ticket": "T-7"},
        ),
    )
    return {"refunded": decision.approved, "by": decision.by}


def pending_proposal(api, run):
    body = api.get(f"/api/runs/{run.pk}").json()
    assert body["status"] == "waiting_human", body
    return body["waiting_for"]["proposal"]


# The shape itself.


def test_a_proposal_is_plain_json_and_comes_back_from_it():
    proposal = Proposal(
        "Update lead Ana Lopez (Acme)",
        target="Lead 1",
        changes=[
            Change("stage", "new", "qualified"),
            Change("owner", UNKNOWN, "kim"),
            Change("notes", None, "call back"),
        ],
        details={"source": "crm"},
    )
    data = proposal.to_json()
    assert data == {
        "summary": "Update lead Ana Lopez (Acme)",
        "target": "Lead 1",
        "changes": [
            {"field": "stage", "before": "new", "after": "qualified"},
            {"field": "owner", "after": "kim"},
            {"field": "notes", "before": None, "after": "call back"},
        ],
        "source": "crm",
    }
    assert Proposal.from_json(data) == proposal


@pytest.mark.parametrize(
    "make",
    [
        lambda: Proposal(""),
        lambda: Proposal("Do it", details={"changes": []}),
        lambda: Proposal("Do it", changes=[("stage", "a", "b")]),
    ],
)
def test_a_proposal_without_a_summary_or_with_clashing_details_is_refused(make):
    with pytest.raises((ValueError, TypeError)):
        make()


@pytest.mark.parametrize(
    "stored",
    [
        [],
        "Ship it",
        {"tool": "send_email", "arguments": {"to": "ana@example.com"}},  # an older tool-call shape
        {"summary": "Ship it", "changes": "all of them"},
        {"summary": "Ship it", "changes": [{"after": 1}]},  # a change names its field
        {"summary": "Ship it", "target": 7},
    ],
)
def test_json_of_another_shape_is_not_read_back_as_a_proposal(stored):
    """The dashboard reads a stored proposal with the type that wrote it (else it shows the JSON as data)."""
    with pytest.raises(ValueError):
        Proposal.from_json(stored)


def test_propose_needs_an_approval_to_describe():
    with pytest.raises(TypeError, match="needs_approval"):
        tool(lambda lead_id: {}, name="write", propose=lambda lead_id: Proposal("Write"))


# ctx.approval


@pytest.mark.django_db(transaction=True)
def test_ctx_approval_stores_a_proposal_as_json_and_the_api_returns_it_as_stored(tenant, api):
    run = submit_run(tenant=tenant, kind="proposals_refund", input={})
    [run] = drive(run)
    stored = pending_proposal(api, run)
    assert stored == {
        "summary": "Refund order 1042",
        "target": "Order 1042 (ana@example.com)",
        "changes": [
            {"field": "status", "before": "paid", "after": "refunded"},
            {"field": "balance", "before": 120, "after": 0},
            {"field": "reason", "after": "damaged"},
        ],
        "ticket": "T-7",
    }
    assert Step.objects.get(run=run, kind="approval").input == {"proposal": stored}
    view = proposal_view(stored)
    assert (view.summary, view.target, view.has_before) == (
        "Refund order 1042",
        "Order 1042 (ana@example.com)",
        True,
    )
    assert [(r.field, r.before_known and r.before, r.after) for r in view.rows] == [
        ("Status", "paid", "refunded"),
        ("Balance", "120", "0"),
        ("Reason", False, "damaged"),
    ]
    approve_run(run=run, actor=PERSON)
    [run] = drive(run)
    assert run.status == "done" and run.result == {"refunded": True, "by": "user:42"}, run.error


# The LLM loop


@pytest.mark.django_db(transaction=True)
def test_the_loop_proposes_a_call_from_its_arguments_and_the_models_note(tenant, api, fake_llm):
    fake_llm.enqueue(
        say("I will tell Ana.", ("send_email", {"to": "ana@example.com", "subject": "Shipped"})),
        say("Sent."),
    )
    run = submit_run(tenant=tenant, kind="proposals_mail", input={})
    [run] = drive(run)
    proposal = pending_proposal(api, run)
    assert proposal == {
        "summary": "Call send_email",
        "target": "",
        "changes": [
            {"field": "to", "after": "ana@example.com"},
            {"field": "subject", "after": "Shipped"},
        ],
        "tool": "send_email",
        "arguments": {"to": "ana@example.com", "subject": "Shipped"},
        "note": "I will tell Ana.",
    }
    view = proposal_view(proposal)
    assert view.summary == "Call send_email" and view.note == "I will tell Ana."
    assert not view.has_before  # nothing was read: the card shows the proposed values only
    approve_run(run=run, actor=PERSON)
    [run] = drive(run)
    assert run.status == "done" and run.result["answer"] == "Sent.", run.error


def make_lead(tenant, **fields):
    return Lead.objects.create(
        tenant=tenant,
        **(
            {"name": "Ana Lopez", "company": "Acme", "email": "ana@acme.test", "stage": "new"}
            | fields
        ),
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("provider", ["scripted", "openai"])
def test_the_crm_write_proposes_the_leads_current_stage_as_before(tenant, api, provider, request):
    if provider == "openai":
        request.getfixturevalue("fake_llm").brain = from_script(crm_script)
    else:
        request.getfixturevalue("offline")
    lead = make_lead(tenant)
    run = submit_run(
        tenant=tenant,
        kind="crm_update",
        input={"lead_id": lead.pk, "instruction": "Budget confirmed, they qualify"},
    )
    [run] = drive(run)
    proposal = pending_proposal(api, run)
    assert proposal["summary"] == "Update lead Ana Lopez (Acme)"
    assert proposal["target"] == f"Lead {lead.pk} (ana@acme.test)"
    assert proposal["changes"] == [
        {"field": "stage", "before": "new", "after": "qualified"},
        {"field": "note", "before": None, "after": "Budget confirmed, they qualify"},
    ]
    # What the model asked for stays where API clients read it.
    assert proposal["arguments"] == {
        "lead_id": lead.pk,
        "stage": "qualified",
        "note": "Budget confirmed, they qualify",
    }
    assert proposal["tool"] == "update_lead" and proposal["note"].startswith(
        "I propose to move it from new"
    )
    [row, _] = proposal_view(proposal).rows
    assert (row.field, row.before, row.after) == ("Stage", "new", "qualified")

    # The lead changes while the run waits: the proposal the person approves is the one recorded, read once.
    Lead.objects.filter(pk=lead.pk).update(stage="contacted")
    approve_run(run=run, actor=PERSON)
    [run] = drive(run)
    assert run.status == "done", run.error
    described = Step.objects.get(run=run, name="Proposing update_lead")
    assert (described.kind, described.executions, described.output["proposal"]["summary"]) == (
        "custom",
        1,
        "Update lead Ana Lopez (Acme)",
    )
    assert Lead.objects.get(pk=lead.pk).stage == "qualified"
    assert LeadUpdate.objects.get(lead=lead).previous["stage"] == "contacted"


@pytest.mark.django_db(transaction=True)
def test_a_crm_write_that_would_change_nothing_is_answered_to_the_model_without_asking_anyone(
    tenant, fake_llm
):
    lead = make_lead(tenant, stage="qualified")
    fake_llm.enqueue(
        say("Reading.", ("get_lead", {"lead_id": lead.pk})),
        say("Moving it.", ("update_lead", {"lead_id": lead.pk, "stage": "qualified"})),
        say("It was already qualified."),
    )
    run = submit_run(
        tenant=tenant, kind="crm_update", input={"lead_id": lead.pk, "instruction": "They qualify"}
    )
    [run] = drive(run)
    assert run.status == "done", run.error
    assert not Step.objects.filter(run=run, kind="approval").exists()
    told = [m for m in fake_llm.bodies()[2]["messages"] if m["role"] == "tool"][-1]["content"]
    assert (
        told
        == f"Error: nothing to update: lead {lead.pk} is already at stage qualified and no note was given"
    )
    assert not LeadUpdate.objects.exists()


def test_a_propose_function_gets_the_validated_arguments_and_ctx_when_it_asks():
    seen = []

    def describe(ctx, lead_id: int, stage: Literal["won", "lost"]) -> Proposal:
        seen.append((ctx, lead_id, stage))
        return Proposal(f"Move lead {lead_id}", changes=[Change("stage", "new", stage)])

    @tool(needs_approval=True, propose=describe)
    def move(lead_id: int, stage: Literal["won", "lost"]) -> dict:
        """Move a lead."""
        return {}

    assert move.proposal("the ctx", {"lead_id": 3, "stage": "won"}).summary == "Move lead 3"
    assert seen == [("the ctx", 3, "won")]
    assert "propose" not in move.spec()["function"]["parameters"].get("properties", {})
