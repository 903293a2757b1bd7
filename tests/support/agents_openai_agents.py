"""Agent kinds of tests/workers/frameworks/test_openai_agents.py: OpenAI Agents SDK agents on the durable runner (AGENT_MODULES).

``sdk_tools`` talks to the fake OpenAI server of the test (``LLM_BASE_URL``) through the SDK's own
Chat Completions model. ``sdk_scripted`` and ``sdk_handoff`` are driven by the SDK's own test
model (``agents.testing.ScriptedModel``), which the test puts in ``SCRIPTS`` before it drives the
run with an in-process worker. Every tool execution appends a line to the file named by the
run's ``log`` input, so tests count real executions across processes.
"""

from __future__ import annotations

import json
import os

from agents import Agent, OpenAIChatCompletionsModel, RunContextWrapper, function_tool
from agents.testing import ScriptedModel
from openai import AsyncOpenAI
from pydantic import BaseModel

from workers import Retryable, RunContext, agent
from workers.frameworks.openai_agents import DurableRunner
from workers.llm import conf

# Models of the sdk_scripted and sdk_handoff runs, by the run input's "script".
SCRIPTS: dict[str, dict[str, ScriptedModel]] = {}


class SdkIn(BaseModel):
    prompt: str = "go"
    log: str = ""  # each tool execution appends a line to this file
    max_turns: int = 20
    script: str = ""
    flaky_marker: str = ""  # `flaky` fails once (retryably) while this file does not exist


def executions(path: str) -> list[str]:
    """The tool executions logged to ``path``, in order."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [line.strip() for line in f if line.strip()]


def _log(wrapper: RunContextWrapper[dict], line: str) -> None:
    with open(wrapper.context["log"], "a") as f:
        f.write(line + "\n")


@function_tool
def tick(wrapper: RunContextWrapper[dict], i: int) -> str:
    """Count one tick."""
    _log(wrapper, f"tick {i}")
    return f"tick {i} done"


@function_tool(needs_approval=True)
def refund(wrapper: RunContextWrapper[dict], order_id: str, amount_cents: int) -> str:
    """Refund an order (a person approves each refund)."""
    _log(wrapper, f"refund {order_id} {amount_cents}")
    return json.dumps({"refunded": amount_cents, "order_id": order_id})


# No failure_error_function: the exception reaches the engine instead of the model.
@function_tool(failure_error_function=None)
def flaky(wrapper: RunContextWrapper[dict]) -> str:
    """Fails once with a retryable error, then works."""
    _log(wrapper, "flaky")
    marker = wrapper.context["flaky_marker"]
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise Retryable("the service is busy")
    return "flaky worked"


# One client per server for the whole process, as applications keep theirs: it stays valid from run to run.
_clients: dict[str, AsyncOpenAI] = {}


def _fake_server_model() -> OpenAIChatCompletionsModel:
    url = conf.get("LLM_BASE_URL")
    if url not in _clients:
        _clients[url] = AsyncOpenAI(
            base_url=url, api_key=conf.get("LLM_API_KEY") or "sk-test", max_retries=0
        )
    return OpenAIChatCompletionsModel(model=conf.get("LLM_MODEL"), openai_client=_clients[url])


def _run(ctx: RunContext, bot: Agent, data: SdkIn) -> dict:
    result = DurableRunner(ctx).run(
        bot, data.prompt, context=data.model_dump(), max_turns=data.max_turns
    )
    return {"final_output": result.final_output, "last_agent": result.last_agent.name}


@agent("sdk_tools", input_schema=SdkIn, backoff_base=0.01, backoff_cap=0.05)
def sdk_tools(ctx: RunContext, data: SdkIn) -> dict:
    """An SDK agent with a tool and a needs_approval tool, on the fake OpenAI server."""
    bot = Agent(
        name="Counter",
        instructions="You are a test agent.",
        model=_fake_server_model(),
        tools=[tick, refund],
    )
    return _run(ctx, bot, data)


@agent(
    "sdk_tools_short_timeout",
    input_schema=SdkIn,
    step_timeout=1.5,
    backoff_base=0.01,
    backoff_cap=0.05,
)
def sdk_tools_short_timeout(ctx: RunContext, data: SdkIn) -> dict:
    """The same agent with 1.5 s step timeouts (a hung model call times out)."""
    return sdk_tools(ctx, data)


@agent("sdk_scripted", input_schema=SdkIn, max_attempts=3, backoff_base=0.01, backoff_cap=0.05)
def sdk_scripted(ctx: RunContext, data: SdkIn) -> dict:
    """An SDK agent driven by the SDK's ScriptedModel (SCRIPTS[script]["model"])."""
    bot = Agent(
        name="Scripted",
        instructions="You are a test agent.",
        model=SCRIPTS[data.script]["model"],
        tools=[tick, flaky, refund],
    )
    return _run(ctx, bot, data)


@agent("sdk_handoff", input_schema=SdkIn)
def sdk_handoff(ctx: RunContext, data: SdkIn) -> dict:
    """A triage agent that hands off to a specialist with a model of its own."""
    models = SCRIPTS[data.script]
    specialist = Agent(
        name="Specialist", instructions="You count.", model=models["specialist"], tools=[tick]
    )
    triage = Agent(
        name="Triage",
        instructions="Hand off to the specialist.",
        model=models["triage"],
        handoffs=[specialist],
    )
    return _run(ctx, triage, data)
