"""The example kind ``pydantic_ai_demo``: a Pydantic AI agent whose every call is a step of the run.

Input ``{"order_id": 1042, "request": "The parcel never arrived"}``. The agent
looks the order up (a tool), proposes a refund (a tool that requires approval:
the run waits for a person) and answers the customer. With ``LLM_BASE_URL`` it
uses that OpenAI-compatible server (``LLM_API_KEY``, ``LLM_MODEL``); without,
a Pydantic AI ``FunctionModel`` plays the model, so it runs offline. Which of
the two a run uses is recorded at its start and kept for the whole run.
"""

from __future__ import annotations

import functools
import re
import zlib
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from runs.registry import agent
from runs.states import RunOutcome
from workers.context import RunContext
from workers.llm import conf

# Pydantic AI is imported where the kind runs, not here: every web and worker process imports this
# module (examples/agents.py), and importing the framework takes most of a second.
if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models import Model
    from pydantic_ai.models.function import AgentInfo

INSTRUCTIONS = (
    "You are a support agent of an online shop. Look the order up, refund it when the customer's "
    "request justifies it (a person approves refunds), then answer the customer in two sentences."
)
ITEMS = ("a kettle", "a desk lamp", "running shoes", "a rain jacket", "a coffee grinder")


class DemoIn(BaseModel):
    order_id: int = Field(1042, ge=1)
    request: str = Field("The parcel never arrived", min_length=1, max_length=2000)


def look_up_order(order_id: int) -> dict:
    """Look up an order: what was bought, what it cost (in cents) and where it is."""
    seed = zlib.crc32(str(order_id).encode())
    return {
        "order_id": order_id,
        "item": ITEMS[seed % len(ITEMS)],
        "amount_cents": 1500 + seed % 8500,
        "status": "shipped",
    }


def refund_order(order_id: int, amount_cents: int, reason: str) -> dict:
    """Refund ``amount_cents`` of an order to the customer, saying why."""
    return {"order_id": order_id, "refunded_cents": amount_cents, "reason": reason}


def offline_brain(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The model when none is configured: look up, propose the refund, answer."""
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart

    results = {p.tool_name: p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
    prompt = next(str(p.content) for m in messages for p in m.parts if p.part_kind == "user-prompt")
    order_id = int(re.search(r"Order (\d+)", prompt).group(1))
    if "look_up_order" not in results:
        return ModelResponse(parts=[ToolCallPart("look_up_order", {"order_id": order_id})])
    order = results["look_up_order"].content
    if "refund_order" not in results:
        arguments = {
            "order_id": order_id,
            "amount_cents": order["amount_cents"],
            "reason": prompt.split(": ", 1)[-1],
        }
        return ModelResponse(parts=[ToolCallPart("refund_order", arguments)])
    refund = results["refund_order"]
    if refund.outcome == "denied":
        text = f"I could not refund your order of {order['item']}: {refund.content} A colleague will contact you."
    else:
        text = f"I refunded {order['amount_cents'] / 100:.2f} for {order['item']}. Sorry for the trouble."
    return ModelResponse(parts=[TextPart(text)])


def choose_model() -> dict:
    """Which model runs that start now use (recorded, so a run keeps it)."""
    if conf.get("LLM_BASE_URL"):
        return {"provider": "openai", "model": conf.get("LLM_MODEL") or "gpt-4o-mini"}
    return {"provider": "scripted", "model": "scripted"}


@functools.cache
def support_agent(provider: str, model_name: str, base_url: str = "", api_key: str = "") -> Agent:
    """One agent per model (and so one HTTP client per process, on the event loop the runs share)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.function import FunctionModel

    from workers.frameworks.pydantic_ai import AgentRunsDurability

    model: Model
    if provider == "openai":
        from openai import AsyncOpenAI
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        # The SDK's own retries are off: the engine retries, with backoff and Retry-After.
        client = AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed", max_retries=0)
        model = OpenAIChatModel(model_name, provider=OpenAIProvider(openai_client=client))
    else:
        model = FunctionModel(offline_brain, model_name=model_name)
    built = Agent(
        model,
        name="pydantic_ai_demo",
        instructions=INSTRUCTIONS,
        capabilities=[AgentRunsDurability()],
    )
    built.tool_plain(look_up_order)
    built.tool_plain(requires_approval=True)(refund_order)
    return built


@agent(
    "pydantic_ai_demo",
    input_schema=DemoIn,
    title=lambda data: f"Order {data['order_id']}: {data['request']}",
)
def pydantic_ai_demo(ctx: RunContext, data: DemoIn) -> dict:
    """A Pydantic AI support agent: looks an order up, refunds it once a person approves, answers."""
    from pydantic_ai.messages import ToolReturnPart

    from workers.frameworks.pydantic_ai import run_agent

    setup = ctx.step("Choosing the model", choose_model)
    chosen = support_agent(
        setup["provider"],
        setup["model"],
        conf.get("LLM_BASE_URL") or "",
        conf.get("LLM_API_KEY") or "",
    )
    result = run_agent(ctx, chosen, f"Order {data.order_id}: {data.request}")
    refunds = [
        p
        for m in result.all_messages()
        for p in m.parts
        if isinstance(p, ToolReturnPart) and p.tool_name == "refund_order"
    ]
    refunded = any(p.outcome != "denied" for p in refunds)
    if refunded:
        ctx.report(f"Refunded order {data.order_id}")
    else:
        ctx.report(
            f"Answered about order {data.order_id} without a refund", outcome=RunOutcome.UNCHANGED
        )
    return {"answer": result.output, "model": setup["model"], "refunded": refunded}
