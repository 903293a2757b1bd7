"""The OpenAI Agents SDK on this engine: ``DurableRunner(ctx).run(agent, input)`` in place of ``Runner.run``.

Inside a kind, each model call the SDK makes is one checkpointed step (``kind="llm"``, "Thinking
(iteration N)", with its tokens and cost) and each function tool call one step (``kind="tool"``,
"Calling <tool>"). On replay the SDK's loop runs again from the start and those steps return what
they recorded, so a run killed at its fourth model call makes the calls from the fourth on only. A
tool declared ``needs_approval`` becomes ``ctx.approval``: the run waits for a person, then the SDK
resumes with the call approved (the tool runs, once) or rejected (the model is told).

How: the agent (with the agents it hands off to) is copied with each model wrapped in a
``DurableModel`` (model names go through a provider that wraps what it returns) and each
``FunctionTool``'s invoker wrapped. The SDK's coroutines run on the process's event loop for
frameworks (``workers.frameworks.bridge``: a thread of its own, shared by the process's runs, so
that async clients bound to it stay valid), while the agent function's thread, the one its
``RunContext`` belongs to, makes the steps they ask for, one at a time in the order asked. SDK
tracing is off for these runs: nothing is exported to OpenAI.
"""

from __future__ import annotations

try:
    import agents  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the OpenAI Agents SDK adapter needs openai-agents: pip install 'agentruns[openai-agents]'"
    ) from exc

import contextvars
import copy
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agents import (
    Agent,
    CodeInterpreterTool,
    FileSearchTool,
    FunctionTool,
    Handoff,
    HostedMCPTool,
    ImageGenerationTool,
    MaxTurnsExceeded,
    Model,
    ModelProvider,
    ModelResponse,
    ModelSettings,
    RunConfig,
    Runner,
    RunResult,
    ToolApprovalItem,
    ToolExecutionConfig,
    ToolSearchTool,
    UserError,
    WebSearchTool,
)
from pydantic_core import to_jsonable_python

from runs.actors import sentence_start
from workers.errors import Fatal, StopRun
from workers.frameworks.bridge import Bridge
from workers.frameworks.openai_agents_records import load_response, parsed, recordable, step_output
from workers.llm import capacity, pricing
from workers.proposals import UNKNOWN, Change, Proposal
from workers.values import StepResult

if TYPE_CHECKING:
    from workers.context import RunContext

__all__ = ["DurableModel", "DurableRunner", "step_options"]

# Tools the provider runs inside the model call (its step); every other kind but FunctionTool
# would run on this machine outside any step, and run again on replay.
HOSTED_TOOLS = (
    FileSearchTool,
    WebSearchTool,
    HostedMCPTool,
    CodeInterpreterTool,
    ImageGenerationTool,
    ToolSearchTool,
)
NAME_MAX = 200  # Step.name
_OPTIONS = "_agentruns_step_options"
# Set while a step's coroutine runs: model and tool calls made inside it (an agent used as a
# tool) are part of that step, and add their usage to it.
_INSIDE_STEP: contextvars.ContextVar[_Usage | None] = contextvars.ContextVar(
    "agentruns_inside_step", default=None
)


@dataclass(frozen=True)
class StepOptions:
    side_effect: bool = False
    timeout: float | None = None


def step_options(
    tool: FunctionTool, *, side_effect: bool = False, timeout: float | None = None
) -> FunctionTool:
    """Say how ``DurableRunner`` makes ``tool``'s calls as steps; returns ``tool``.

    ``side_effect=True`` writes each call's step ahead of calling the tool, with an idempotency key
    (``ctx.idempotency_key`` inside the tool, to pass to the callee): a worker that dies inside it
    repeats the call with the same key. ``timeout`` (seconds) is the step timeout of its calls (a
    ``timeout_seconds`` given to ``function_tool`` is used otherwise).
    """
    setattr(tool, _OPTIONS, StepOptions(side_effect=side_effect, timeout=timeout))
    return tool


class DurableRunner:
    """Runs OpenAI Agents SDK agents in a run, each model call and each function tool call a step.

    ``DurableRunner(ctx).run(agent, input, ...)`` takes what ``Runner.run`` takes and returns its
    ``RunResult``, synchronously, from the agent function. ``timeout`` (seconds) overrides the step
    timeout of model calls. Pass ``tracing=True`` to keep the SDK's tracing as configured.

    A sync function tool runs on a thread (it may use the ORM); an async one runs on the event
    loop the process's runs share, which it must not block. A tool's exception is told to the
    model, as the SDK does, unless the tool has ``failure_error_function=None``: then it fails its
    step, and the engine handles it (a ``Retryable`` is retried with backoff). The calls of one
    turn run one after another, in the model's order.
    """

    def __init__(self, ctx: RunContext, *, timeout: float | None = None, tracing: bool = False):
        self.ctx = ctx
        self.timeout = timeout
        self.tracing = tracing
        self.iterations = 0  # model calls made (or replayed) so far
        self._agents: dict[int, tuple[Agent[Any], Agent[Any]]] = {}
        self._bridge: Bridge | None = None

    def run(
        self,
        starting_agent: Agent[Any],
        input: Any,
        *,
        context: Any = None,
        run_config: RunConfig | None = None,
        **options: Any,
    ) -> RunResult:
        """Run ``starting_agent`` on ``input`` to its final output, as ``Runner.run`` would, durably.

        A model call or tool call recorded by an earlier execution of the run returns its record
        without being made again. A ``needs_approval`` tool call asks for ``ctx.approval("Approve
        <tool>")`` (the proposal shows its arguments); once a person decided, the SDK resumes with
        the call approved or rejected, and a rejection's comment is told to the model. ``context``
        defaults to ``ctx``, so a tool taking a ``RunContextWrapper`` reaches the run through
        ``wrapper.context``. Running out of ``max_turns`` fails the run as ``step_limit``. Other
        options (``max_turns``, ``hooks``...) are passed on, except ``session``: replays would write
        its history again.
        """
        if options.get("session") is not None:
            raise Fatal(
                "DurableRunner cannot use an SDK session: a replay would write its history again"
            )
        agent = self._durable_agent(starting_agent)
        config, owns_provider = self._durable_config(run_config)
        options = {
            "context": self.ctx if context is None else context,
            "run_config": config,
            **options,
        }

        async def main() -> RunResult:
            pending = input
            try:
                while True:
                    result = await Runner.run(agent, pending, **options)
                    if not result.interruptions:
                        return result
                    state = result.to_state()
                    for item in result.interruptions:
                        await bridge.call(functools.partial(self._decide, state, item))
                    pending = state
            finally:
                if owns_provider:
                    await config.model_provider.aclose()

        bridge = self._bridge = Bridge(f"the OpenAI Agents SDK agent of run {self.ctx.run_id}")
        try:
            return bridge.run(main)
        except MaxTurnsExceeded as exc:
            raise StopRun(
                "step_limit",
                f"the agent used its {options.get('max_turns') or 'default'} turns "
                f"without a final output (max_turns): {exc}",
            ) from exc
        finally:
            self._bridge = None

    run_sync = run

    # Steps: what the durable models and tools ask of their runner.
    async def model_step(
        self,
        model: DurableModel,
        call: Callable[[ModelSettings], Awaitable[ModelResponse]],
        input: Any,
        tools: list[Any],
        settings: ModelSettings,
    ) -> ModelResponse:
        """``call`` (one call of ``model``) as the run's next ``llm`` step, or that step's record on replay."""
        bridge = self._running()
        self.iterations += 1
        iteration = self.iterations
        request = {
            "model": model.name,
            "iteration": iteration,
            "messages": len(input) if isinstance(input, list) else 1,
            "tools": [getattr(tool, "name", type(tool).__name__) for tool in tools],
        }

        def make_step() -> Any:
            timeout = self.ctx.step_timeout(self.timeout)

            def think(request: dict) -> StepResult:
                limited = self._affordable(settings, model.name, input, tools)
                with capacity.model_call(
                    self.ctx,
                    provider="openai",
                    model=model.name,
                    prompt=to_jsonable_python([input, request["tools"]], fallback=str),
                    max_tokens=limited.max_tokens,
                ) as reported:
                    response = bridge.wait(
                        lambda: _inside_step(_Usage(), lambda: call(limited)), timeout
                    )
                    reported.tokens = response.usage.input_tokens + response.usage.output_tokens
                usage = response.usage
                cost = pricing.cost_cents(model.name, usage.input_tokens, usage.output_tokens)
                return StepResult(
                    step_output(response), usage.input_tokens, usage.output_tokens, cost
                )

            return self.ctx.step(
                f"Thinking (iteration {iteration})",
                think,
                kwargs={"request": request},
                kind="llm",
                timeout=timeout,
            )

        recorded = await bridge.call(make_step)
        return load_response(recorded["response"])

    async def tool_step(
        self,
        invoker: Callable[[Any, str], Awaitable[Any]],
        tool_context: Any,
        arguments: str,
        options: StepOptions,
        typed: bool,
    ) -> Any:
        """One function tool call (``invoker`` on ``arguments``) as a ``tool`` step, or its record on replay."""
        bridge = self._running()
        name = tool_context.tool_name
        call = {"id": tool_context.tool_call_id, "name": name, "arguments": parsed(arguments)}

        def make_step() -> Any:
            timeout = self.ctx.step_timeout(options.timeout)

            def execute(call: dict) -> Any:
                usage = _Usage()
                output = bridge.wait(
                    lambda: _inside_step(usage, lambda: invoker(tool_context, arguments)), timeout
                )
                recorded = {"content": recordable(output, typed=typed)}
                return usage.result(recorded) if usage.calls else recorded

            return self.ctx.step(
                f"Calling {name}"[:NAME_MAX],
                execute,
                kwargs={"call": call},
                kind="tool",
                side_effect=options.side_effect,
                idempotency_key=True if options.side_effect else None,
                timeout=timeout,
            )

        recorded = await bridge.call(make_step)
        return recorded["content"]

    def _decide(self, state: Any, item: ToolApprovalItem) -> None:
        """Ask a person about one call (this suspends the run until they decide), and tell the SDK."""
        name = item.qualified_name or item.name or "a tool"
        arguments = parsed(item.arguments or "")
        changes = (
            [Change(key, UNKNOWN, value) for key, value in arguments.items()]
            if isinstance(arguments, dict)
            else []
        )
        proposal = Proposal(
            summary=f"Call {name}",
            changes=changes,
            details={
                "tool": name,
                "arguments": arguments,
                "call_id": item.call_id or "",
                "agent": getattr(item.agent, "name", ""),
            },
        )
        decision = self.ctx.approval(f"Approve {name}"[:NAME_MAX], proposal=proposal)
        if decision.approved:
            state.approve(item)
            return
        who = sentence_start(decision.by_name or "a person")
        reason = f": {decision.comment}" if decision.comment else ""
        state.reject(item, rejection_message=f"{who} rejected this call{reason}. Do not retry it.")

    def _affordable(
        self, settings: ModelSettings, model: str, input: Any, tools: list[Any]
    ) -> ModelSettings:
        """``settings`` with output tokens capped by what the run's remaining budget can pay for."""
        left = self.ctx.budget_left_cents
        price = pricing.price_for(model) if left is not None else None
        if left is None or price is None or price.output <= 0:
            return settings
        input_cost = price.input * pricing.estimate_tokens(to_jsonable_python(input, fallback=str))
        affordable = int((left - input_cost) / price.output)
        if affordable < 1:
            raise StopRun(
                "budget",
                f"the run's remaining budget ({left:.6f}¢) cannot pay for another model call "
                f"(about {input_cost:.6f}¢ of input alone)",
            )
        return settings.resolve(
            ModelSettings(max_tokens=min(settings.max_tokens or affordable, affordable))
        )

    def _running(self) -> Bridge:
        if self._bridge is None:
            raise UserError(
                "this agent's models and tools belong to a DurableRunner: run it with DurableRunner.run"
            )
        return self._bridge

    # The agent graph, with its models and tools made durable.
    def _durable_config(self, run_config: RunConfig | dict | None) -> tuple[RunConfig, bool]:
        owns_provider = run_config is None or (
            isinstance(run_config, dict) and "model_provider" not in run_config
        )
        config = (
            RunConfig(**run_config) if isinstance(run_config, dict) else run_config or RunConfig()
        )
        execution = config.tool_execution or ToolExecutionConfig()
        changes: dict[str, Any] = {
            "model_provider": _DurableProvider(config.model_provider, self),
            # One tool call at a time, in the model's order: replay meets them in the same order.
            "tool_execution": dataclasses.replace(execution, max_function_tool_concurrency=1),
            "tracing_disabled": config.tracing_disabled or not self.tracing,
        }
        if isinstance(config.model, Model):
            changes["model"] = self.durable_model(config.model)
        return dataclasses.replace(config, **changes), owns_provider

    def durable_model(self, model: Model, name: str | None = None) -> Model:
        """``model`` with its calls made steps of this runner's run (a ``DurableModel``)."""
        return model if isinstance(model, DurableModel) else DurableModel(model, self, name=name)

    def _durable_agent(self, agent: Agent[Any]) -> Agent[Any]:
        known = self._agents.get(id(agent))
        if known is not None:
            return known[1]
        if agent.mcp_servers:
            raise Fatal(
                f"agent {agent.name!r} has MCP servers: their tool calls would not be steps "
                "(DurableRunner checkpoints function tools only)"
            )
        for tool in agent.tools:
            if not isinstance(tool, (FunctionTool, *HOSTED_TOOLS)):
                raise Fatal(
                    f"agent {agent.name!r} has a {type(tool).__name__}, which runs on this machine outside "
                    "any step: DurableRunner checkpoints function tools only"
                )
        clone = agent.clone()
        self._agents[id(agent)] = (
            agent,
            clone,
        )  # the original stays referenced, so its id stays unique
        if isinstance(agent.model, Model):
            clone.model = self.durable_model(agent.model)
        clone.tools = [self._durable_tool(tool) for tool in agent.tools]
        clone.handoffs = [self._durable_handoff(handoff) for handoff in agent.handoffs]
        return clone

    def _durable_tool(self, tool: Any) -> Any:
        if not isinstance(tool, FunctionTool):
            return tool
        durable = copy.copy(tool)
        options = getattr(tool, _OPTIONS, None) or StepOptions()
        if tool.timeout_seconds is not None:
            # The step's timeout replaces the SDK's: a call the SDK gave up on would still be recorded.
            options = dataclasses.replace(options, timeout=options.timeout or tool.timeout_seconds)
            durable.timeout_seconds = None
        typed = tool.output_json_schema is not None
        durable.on_invoke_tool = _DurableInvoker(self, durable.on_invoke_tool, options, typed)
        return durable

    def _durable_handoff(self, handoff: Any) -> Any:
        if isinstance(handoff, Agent):
            return self._durable_agent(handoff)
        if isinstance(handoff, Handoff):
            original = handoff.on_invoke_handoff

            async def invoke(context: Any, arguments: str) -> Any:
                return self._durable_agent(await original(context, arguments))

            return dataclasses.replace(handoff, on_invoke_handoff=invoke)
        return handoff


class DurableModel(Model):
    """A ``Model`` whose calls are steps of the run of a ``DurableRunner`` (made for you by ``run``)."""

    def __init__(self, inner: Model, runner: DurableRunner, *, name: str | None = None):
        self.inner = inner
        self.runner = runner
        # The name prices the call (RUNS_LLM_PRICES): the model's own, else the name it was asked for.
        self.name = str(getattr(inner, "model", None) or name or type(inner).__name__)

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
        def call(settings: ModelSettings) -> Awaitable[ModelResponse]:
            return self.inner.get_response(
                system_instructions,
                input,
                settings,
                tools,
                output_schema,
                handoffs,
                tracing,
                **options,
            )

        inside = _INSIDE_STEP.get()
        if inside is not None:  # part of a tool's step (an agent used as a tool)
            response = await call(model_settings)
            inside.add(self.name, response.usage)
            return response
        if model_settings.timeout is not None:
            raise UserError(
                "ModelSettings.timeout cannot bound a durable model call: the step timeout does "
                "(DurableRunner(ctx, timeout=...) or the kind's step_timeout)"
            )
        return await self.runner.model_step(self, call, input, tools, model_settings)

    async def stream_response(self, *args, **kwargs):
        raise UserError("DurableRunner does not stream: use DurableRunner.run")
        yield  # an async generator, as the interface wants

    def get_retry_advice(self, request):
        return self.inner.get_retry_advice(request)

    async def close(self) -> None:
        await self.inner.close()

    async def _cleanup_on_run_end(self, owner: object) -> None:
        cleanup = getattr(self.inner, "_cleanup_on_run_end", None)  # the SDK's own hook, passed on
        if cleanup is not None:
            await cleanup(owner)


class _DurableProvider(ModelProvider):
    """The run config's provider, its models made durable."""

    def __init__(self, inner: ModelProvider, runner: DurableRunner):
        self.inner = inner
        self.runner = runner

    def get_model(self, model_name: str | None) -> Model:
        return self.runner.durable_model(self.inner.get_model(model_name), name=model_name)

    async def aclose(self) -> None:
        await self.inner.aclose()


class _DurableInvoker:
    """A function tool's invoker that makes each of its calls a step."""

    def __init__(
        self,
        runner: DurableRunner,
        inner: Callable[[Any, str], Awaitable[Any]],
        options: StepOptions,
        typed: bool,
    ):
        self.runner = runner
        self.inner = inner
        self.options = options
        self.typed = typed

    async def __call__(self, tool_context: Any, arguments: str) -> Any:
        if _INSIDE_STEP.get() is not None:  # part of an enclosing tool's step
            return await self.inner(tool_context, arguments)
        return await self.runner.tool_step(
            self.inner, tool_context, arguments, self.options, self.typed
        )


async def _inside_step(usage: _Usage, make: Callable[[], Awaitable[Any]]) -> Any:
    """``await make()`` as part of a step: the model and tool calls it makes add their usage to it instead."""
    _INSIDE_STEP.set(usage)  # in the task's context, and the tasks it starts
    return await make()


@dataclass
class _Usage:
    """What the model calls inside one step used (an agent used as a tool)."""

    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_cents: Decimal = Decimal(0)

    def add(self, model: str, usage: Any) -> None:
        self.calls += 1
        self.tokens_in += usage.input_tokens
        self.tokens_out += usage.output_tokens
        self.cost_cents += pricing.cost_cents(model, usage.input_tokens, usage.output_tokens)

    def result(self, output: Any) -> StepResult:
        return StepResult(output, self.tokens_in, self.tokens_out, self.cost_cents)
