"""Agent kinds of tests/workers/frameworks/test_pydantic_ai.py: Pydantic AI agents with AgentRunsDurability (AGENT_MODULES).

``pai_openai`` talks to the OpenAI-compatible server of ``LLM_BASE_URL`` (the
fake of tests/support/fake_openai.py); ``pai_test_model`` and ``pai_flaky`` use Pydantic
AI's own TestModel and FunctionModel, and run in the test process too.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from pathlib import Path

from openai import AsyncOpenAI
from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.models.test import TestModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.tools import RunContext as AgentContext

from workers import RunContext, agent
from workers.errors import Retryable
from workers.frameworks.pydantic_ai import AgentRunsDurability, run_agent
from workers.llm import conf


def tick(i: int) -> dict:
    """Count one tick."""
    return {"tick": i}


def hold(path: str) -> str:
    """Wait while the file at ``path`` exists."""
    while os.path.exists(path):
        time.sleep(0.05)
    return "released"


def record(note: str, path: str) -> str:
    """Append ``note`` to the file at ``path`` (a person approves it first)."""
    with open(path, "a") as file:
        file.write(note + "\n")
    return f"recorded {note}"


@functools.cache
def _openai_agent(base_url: str, api_key: str, model: str) -> Agent:
    # One client per process: the SDK's own retries off, the engine retries.
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    chat = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))
    built = Agent(
        chat,
        name="pai_openai",
        instructions="You are a test agent.",
        capabilities=[AgentRunsDurability()],
    )
    built.tool_plain(tick)
    built.tool_plain(hold)
    built.tool_plain(requires_approval=True)(record)
    return built


class PromptIn(BaseModel):
    prompt: str = "go"


def _on_the_server(ctx: RunContext, data: PromptIn) -> dict:
    chosen = _openai_agent(
        conf.get("LLM_BASE_URL"), conf.get("LLM_API_KEY") or "none", conf.get("LLM_MODEL")
    )
    result = run_agent(ctx, chosen, data.prompt)
    return {"output": result.output, "messages": len(result.all_messages())}


@agent("pai_openai", input_schema=PromptIn)
def pai_openai(ctx: RunContext, data: PromptIn) -> dict:
    """A Pydantic AI agent on the OpenAI-compatible server of LLM_BASE_URL."""
    return _on_the_server(ctx, data)


@agent("pai_openai_short_timeout", input_schema=PromptIn, step_timeout=1.5)
def pai_openai_short_timeout(ctx: RunContext, data: PromptIn) -> dict:
    """The same agent with 1.5 s step timeouts (a hung model request times out)."""
    return _on_the_server(ctx, data)


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def shout(text: str) -> str:
    """Say it louder."""
    return text.upper()


tested = Agent(
    TestModel(), name="pai_test_model", capabilities=[AgentRunsDurability()], tools=[add, shout]
)


@agent("pai_test_model")
def pai_test_model(ctx: RunContext, data: dict) -> dict:
    """Pydantic AI's TestModel calls every tool once, then answers."""
    return {"output": run_agent(ctx, tested, "use your tools").output}


@agent("pai_two_turns")
def pai_two_turns(ctx: RunContext, data: dict) -> dict:
    """Two agent runs in one kind, the second continuing the first's conversation."""
    first = run_agent(ctx, tested, "first")
    second = run_agent(ctx, tested, "second", message_history=first.all_messages())
    return {
        "run_ids": [first.run_id, second.run_id],
        "new": len(second.new_messages()),
        "all": len(second.all_messages()),
    }


# What the flaky kind's FunctionModel was asked, and how often its tool ran (in this process).
MODEL_CALLS: list[int] = []
TOOL_CALLS: list[str] = []


def _brain(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    MODEL_CALLS.append(len(messages))
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("fetch", {"key": "answer"})])
    return ModelResponse(parts=[TextPart(f"the answer is {returned[-1].content}")])


flaky = Agent(
    FunctionModel(_brain, model_name="scripted"),
    name="pai_flaky",
    capabilities=[AgentRunsDurability()],
)


@flaky.tool_plain
def fetch(key: str) -> str:
    """Fetch a value; the first call in a process fails as a provider's 503 would."""
    TOOL_CALLS.append(key)
    if len(TOOL_CALLS) == 1:
        raise Retryable("the service is warming up")
    return "42"


@agent("pai_flaky", backoff_base=0.05, backoff_cap=0.1)
def pai_flaky(ctx: RunContext, data: dict) -> dict:
    """A FunctionModel agent whose tool fails once: the retry replays the recorded model call."""
    return {"output": run_agent(ctx, flaky, "what is the answer?").output}


class DirectIn(BaseModel):
    how: str = "run_sync"  # or "run"


@agent("pai_direct", input_schema=DirectIn)
def pai_direct(ctx: RunContext, data: DirectIn) -> dict:
    """Runs a durable agent itself instead of with run_agent: refused, not run without steps."""
    if data.how == "run":
        return {"output": asyncio.run(flaky.run("what is the answer?")).output}
    return {"output": flaky.run_sync("what is the answer?").output}


def _charge_brain(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    returned = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returned:
        return ModelResponse(parts=[ToolCallPart("charge", {"cents": 250})])
    return ModelResponse(parts=[TextPart(f"charged with key {returned[-1].content}")])


charging = Agent(
    FunctionModel(_charge_brain, model_name="scripted"),
    name="pai_charging",
    deps_type=RunContext,
    capabilities=[AgentRunsDurability()],
)


@charging.tool(metadata={"agentruns": {"side_effect": True}})
def charge(ctx: AgentContext[RunContext], cents: int) -> str:
    """Charge the customer ``cents``, once per idempotency key."""
    return ctx.deps.idempotency_key


@agent("pai_charging")
def pai_charging(ctx: RunContext, data: dict) -> dict:
    """A tool with a side effect: written ahead, with the key the engine gives it."""
    return {"output": run_agent(ctx, charging, "charge 2.50", deps=ctx).output}


def written_lines(path: str | Path) -> list[str]:
    path = Path(path)
    return path.read_text().splitlines() if path.exists() else []


@agent("pai_in_a_step")
def pai_in_a_step(ctx: RunContext, data: dict) -> dict:
    """The whole agent run as one step of the kind's own: the step records it."""
    return {"output": ctx.step("ask the agent", lambda: tested.run_sync("use your tools").output)}
