"""The example ``openai_agents_demo`` kind: an OpenAI Agents SDK agent run durably (``workers.frameworks.openai_agents``).

A support agent looks an order up and refunds it; the refund tool needs a person's approval
(``needs_approval=True``) and writes with its step's idempotency key. With ``LLM_BASE_URL`` set
the agent talks to that OpenAI-compatible server (``LLM_MODEL``, ``LLM_API_KEY``) through the
SDK's Chat Completions model; without, a deterministic scripted model on the SDK's ``Model``
interface plays the part offline (``demo_reply``): it looks the order up, asks for the refund,
then answers from what it was told.

Importing this module registers the kind without importing the SDK, which takes a couple of
seconds that every web and worker process would pay: the SDK's pieces are built by ``_sdk()`` on
the first run.
"""

import asyncio
import functools
import hashlib
import json
import re
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from pydantic import BaseModel, Field

from runs.registry import agent
from runs.states import RunOutcome
from workers.context import RunContext
from workers.llm import conf, pricing

INSTRUCTIONS = (
    "You are a support agent for a small shop. Look the order up with lookup_order, then refund its "
    "total with issue_refund when the customer's complaint warrants it. Answer in two sentences."
)

# The shop's orders (a stand-in for the database the tools would read).
ORDERS = {
    "A-1001": {
        "item": "Electric kettle",
        "total_cents": 3499,
        "status": "delivered",
        "customer": "Kim Lee",
    },
    "A-1002": {
        "item": "Desk lamp",
        "total_cents": 5900,
        "status": "delivered",
        "customer": "Ana Lopez",
    },
}
SCRIPTED_MODEL = "scripted"  # priced in workers.llm.pricing.DEFAULT_PRICES


class RefundIn(BaseModel):
    order_id: str = Field(
        default="A-1001", min_length=1, max_length=40, description="The order, e.g. A-1001"
    )
    message: str = Field(
        default="My kettle arrived broken, I'd like my money back.",
        min_length=3,
        max_length=1000,
        description="What the customer wrote",
    )


@agent(
    "openai_agents_demo",
    input_schema=RefundIn,
    max_attempts=3,
    max_model_iterations=8,
    title="message",
)
def openai_agents_demo(ctx: RunContext, data: RefundIn) -> dict:
    """A support agent on the OpenAI Agents SDK: it looks the order up and refunds it once a person approves."""
    sdk = _sdk()
    choice = ctx.step(
        "Choosing the model", _choose_model
    )  # kept for the whole run, whatever the settings say later
    support = sdk.Agent(
        name="Support",
        instructions=INSTRUCTIONS,
        model=sdk.model(choice),
        tools=[sdk.lookup_order, sdk.issue_refund],
    )
    result = sdk.DurableRunner(ctx).run(
        support, f"Order {data.order_id}: {data.message}", max_turns=6
    )
    refund = next(
        (
            output
            for item in result.new_items
            if isinstance(item, sdk.ToolCallOutputItem)
            if (output := _json(item.output)).get("status") == "refunded"
        ),
        None,
    )
    if refund:
        ctx.report(f"Refunded {refund['amount_cents'] / 100:.2f} on order {refund['order_id']}")
    else:
        ctx.report(f"Nothing was refunded on order {data.order_id}", outcome=RunOutcome.UNCHANGED)
    return {"answer": result.final_output, "refund": refund, "model": choice["model"]}


def demo_reply(items: list[dict]) -> list[dict]:
    """The scripted model's answer to a conversation (Responses input items): output items as dicts."""
    turn = 1 + sum(1 for item in items if item.get("type") == "function_call")
    results = {
        item.get("call_id"): item.get("output")
        for item in items
        if item.get("type") == "function_call_output"
    }
    called = {
        item.get("name"): results.get(item.get("call_id"))
        for item in items
        if item.get("type") == "function_call"
    }
    request = next((str(item.get("content")) for item in items if item.get("role") == "user"), "")
    if "lookup_order" not in called:
        found = re.search(r"[A-Za-z]-\d{3,}", request)
        return [_call(turn, "lookup_order", {"order_id": found.group(0) if found else ""})]
    order = _json(called["lookup_order"])
    if "order_id" not in order:
        return [
            _message(
                f"I could not find that order ({order.get('error', 'no answer')}). "
                "Could you check the order number?"
            )
        ]
    if "issue_refund" not in called:
        return [
            _call(
                turn,
                "issue_refund",
                {
                    "order_id": order["order_id"],
                    "amount_cents": order["total_cents"],
                    "reason": request[:200],
                },
            )
        ]
    refund = _json(called["issue_refund"])
    if refund.get("status") == "refunded":
        return [
            _message(
                f"I refunded ${order['total_cents'] / 100:.2f} for your {order['item']} "
                f"(refund {refund['refund_id']}). It reaches your card within five days."
            )
        ]
    return [
        _message(
            f"I could not refund your {order['item']}: {called['issue_refund']} "
            "A colleague will get back to you."
        )
    ]


def _choose_model() -> dict:
    if conf.provider() == "openai":
        return {"provider": "openai", "model": conf.get("LLM_MODEL") or "gpt-4o-mini"}
    return {"provider": "scripted", "model": SCRIPTED_MODEL}


@functools.cache
def _sdk() -> SimpleNamespace:
    """The SDK's pieces of the demo: its agent class, the tools, the models and the durable runner."""
    from agents import (
        Agent,
        Model,
        ModelResponse,
        OpenAIChatCompletionsModel,
        RunContextWrapper,
        ToolCallOutputItem,
        Usage,
        function_tool,
    )
    from openai import AsyncOpenAI
    from openai.types.responses import ResponseOutputItem
    from pydantic import TypeAdapter

    from workers.frameworks.openai_agents import DurableRunner, step_options

    # This module's annotations are evaluated where they stand (no `from __future__ import
    # annotations`), so function_tool sees these local names.
    @function_tool
    def lookup_order(order_id: str) -> str:
        """Look an order up by its id: the item, its total in cents, its status and the customer."""
        key = order_id.strip().upper()
        order = ORDERS.get(key)
        return json.dumps(
            {"order_id": key, **order} if order else {"error": f"there is no order {key}"}
        )

    @function_tool(needs_approval=True)
    def issue_refund(
        wrapper: RunContextWrapper[RunContext], order_id: str, amount_cents: int, reason: str
    ) -> str:
        """Refund ``amount_cents`` of an order to the customer's card. A person approves each refund first."""
        # wrapper.context is the run's RunContext: the payment provider would take the step's
        # key, so a call repeated after a crash refunds once.
        key = wrapper.context.idempotency_key or ""
        refund_id = "R-" + hashlib.sha256(key.encode()).hexdigest()[:8].upper()
        return json.dumps(
            {
                "refund_id": refund_id,
                "order_id": order_id,
                "amount_cents": amount_cents,
                "status": "refunded",
            }
        )

    step_options(issue_refund, side_effect=True)
    dump_items = TypeAdapter(list[Any])
    load_item = TypeAdapter(ResponseOutputItem)

    class ScriptedDemoModel(Model):
        """``demo_reply`` behind the SDK's Model interface, with tokens estimated from the text and a latency
        scaled by ``RUNS_DEMO_DELAY_SCALE``."""

        model = SCRIPTED_MODEL

        async def get_response(
            self,
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            **options,
        ) -> ModelResponse:
            items = (
                [{"role": "user", "content": input}]
                if isinstance(input, str)
                else dump_items.dump_python(input, mode="json")
            )
            reply = demo_reply(items)
            await asyncio.sleep(0.4 * settings.RUNS_DEMO_DELAY_SCALE)
            tokens_in = pricing.estimate_tokens(
                [system_instructions, items, [tool.name for tool in tools]]
            )
            tokens_out = pricing.estimate_tokens(reply)
            usage = Usage(
                requests=1,
                input_tokens=tokens_in,
                output_tokens=tokens_out,
                total_tokens=tokens_in + tokens_out,
            )
            output = [load_item.validate_python(item) for item in reply]
            return ModelResponse(output=output, usage=usage, response_id=None)

        async def stream_response(self, *args, **kwargs):
            raise NotImplementedError("the scripted demo model does not stream")
            yield

    clients: dict[tuple, AsyncOpenAI] = {}

    def model(choice: dict) -> Model:
        if choice["provider"] != "openai":
            return ScriptedDemoModel()
        # One client per server for the process (the SDK's loop is the process's): its connections are reused.
        # The engine retries a failed call (with backoff, honouring Retry-After): the SDK's retries are off.
        key = (conf.get("LLM_BASE_URL") or None, conf.get("LLM_API_KEY") or "not-needed")
        if key not in clients:
            clients[key] = AsyncOpenAI(base_url=key[0], api_key=key[1], max_retries=0)
        return OpenAIChatCompletionsModel(model=choice["model"], openai_client=clients[key])

    return SimpleNamespace(
        Agent=Agent,
        ToolCallOutputItem=ToolCallOutputItem,
        DurableRunner=DurableRunner,
        model=model,
        lookup_order=lookup_order,
        issue_refund=issue_refund,
    )


def _call(turn: int, name: str, arguments: dict) -> dict:
    call_id = f"call_{turn}_1"
    return {
        "type": "function_call",
        "id": call_id,
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def _message(text: str) -> dict:
    return {
        "type": "message",
        "id": "msg_demo",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _json(value: Any) -> dict:
    try:
        data = json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
