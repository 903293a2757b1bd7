"""An agent kind for the dashboard tests: a support reply that asks for approval before it is sent.

Imported by the dashboard tests (which registers it in the test process and
its live server); worker processes get it through AGENT_MODULES. Its input schema has every field type the
submit form supports. ``DASHBOARD_HOLD_FILE`` in the worker's environment
holds the ``lookup_order`` step while that file exists (until the run is
cancelled), so a test can look at a run that is certainly running.
"""

from __future__ import annotations

import os
import time
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from workers import Fatal, RunContext, StepResult, agent


class ReplyIn(BaseModel):
    customer: str = Field(min_length=3, max_length=120, description="The customer's email address")
    order: str = Field(min_length=3, max_length=20, description="The order number on the invoice")
    message: str = Field(min_length=1, max_length=2000, description="What the customer wrote")
    tone: Literal["friendly", "formal"] = "friendly"
    refund_limit_eur: float = Field(
        default=50, ge=0, le=500, description="The most the agent may offer back"
    )
    drafts: int = Field(default=1, ge=1, le=3, description="How many drafts to compare")
    urgent: bool = False

    @field_validator("customer")
    @classmethod
    def looks_like_an_email(cls, value: str) -> str:
        if "@" not in value:
            raise ValueError("must be an email address, like ana@example.com")
        return value


def _usage(output: dict, tokens_in: int, tokens_out: int) -> StepResult:
    # Priced like a small hosted model: $0.15 / $0.60 per million tokens, in cents.
    return StepResult(
        output, tokens_in, tokens_out, round(tokens_in * 0.15e-4 + tokens_out * 0.60e-4, 6)
    )


def classify(message: str, urgent: bool) -> StepResult:
    intent = "refund" if "refund" in message.lower() or "broken" in message.lower() else "question"
    return _usage({"intent": intent, "urgent": urgent, "language": "en"}, 412, 38)


def lookup_order(ctx: RunContext, order: str) -> dict:
    hold = os.environ.get("DASHBOARD_HOLD_FILE")
    while hold and os.path.exists(hold) and not ctx.cancelled:
        time.sleep(0.05)
    if order.upper().startswith("X"):
        raise Fatal(f"order {order} does not exist in the shop (404 from GET /orders/{order})")
    return {
        "order": order,
        "status": "delivered",
        "total_eur": 89.9,
        "items": ["kettle, steel, 1.7 l"],
    }


def draft_reply(request: dict, order: dict) -> StepResult:
    greeting = "Hi" if request["tone"] == "friendly" else "Dear customer"
    refund = min(order["total_eur"], request["refund_limit_eur"])
    body = (
        f"{greeting},\n\nthank you for writing about order {order['order']}. You wrote: "
        f"\u201c{request['message']}\u201d\nWe are sorry. We will refund {refund:.2f} EUR within three days."
        "\n\nBest regards,\nSupport"
    )
    return _usage(
        {"subject": f"Your order {order['order']}", "body": body, "refund_eur": refund}, 1180, 240
    )


@agent("support_reply", input_schema=ReplyIn)
def support_reply(ctx: RunContext, data: ReplyIn) -> dict:
    """Read a customer's message, look up the order, draft a reply, and send it once a person approves."""
    ctx.progress(total=5)
    intent = ctx.step("classify", classify, data.message, data.urgent, kind="llm")
    order = ctx.step(
        "lookup_order", lambda number: lookup_order(ctx, number), data.order, kind="tool"
    )
    draft = ctx.step("draft_reply", draft_reply, data.model_dump(mode="json"), order, kind="llm")
    proposal = {"to": data.customer, "intent": intent["intent"], **draft}
    decision = ctx.approval("send_reply", proposal=proposal)
    if not decision.approved:
        return {"sent": False, "comment": decision.comment}
    ctx.step(
        "send_email",
        lambda: {"message_id": f"msg-{data.order}"},
        side_effect=True,
        idempotency_key=True,
        kind="tool",
    )
    return {"sent": True, "refund_eur": draft["refund_eur"], "comment": decision.comment}
