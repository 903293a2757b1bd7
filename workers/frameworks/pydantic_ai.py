"""Pydantic AI agents whose model requests and tool calls are checkpointed steps of a run.

An optional extra (``pip install agentruns[pydantic-ai]``). Give the agent the
capability, and run it with ``run_agent`` in a kind::

    support = Agent(model, name="support", capabilities=[AgentRunsDurability()])

    @agent("support")
    def answer(ctx: RunContext, data: dict) -> str:
        return run_agent(ctx, support, data["question"]).output

It is built on Pydantic AI's interface for durable execution engines
(``pydantic_ai.durable_exec``, the one its Temporal, DBOS and Prefect
integrations use): a ``BaseDurabilityCapability`` whose
``CallableOperationBackend`` receives each model request, tool call and tool
listing as one durable unit, which becomes one ``ctx.step``. A unit's result is
stored as JSON by Pydantic AI's own type adapters (``JSON_CODEC``), so a
replayed step hands the agent the same ``ModelResponse`` without calling the
model again. A tool that requires approval becomes ``ctx.approval``.

Threads: ``ctx.step`` belongs to the run's thread, and Pydantic AI is async. The
agent runs on the worker process's event loop for frameworks, and each unit it
asks for is made a step on the run's thread (``workers.frameworks.bridge``),
whose step thread hands the unit's coroutine back to the loop and waits for it.
A run's units therefore go one at a time, in the order asked, and its tool calls
run sequentially.

An agent with the capability that a kind's code runs any other way
(``agent.run_sync()`` between steps) raises ``UserError`` as it starts: its
calls would not be steps, and the run would look durable without being so.
Outside any run (a script, a unit test of the agent) it is a plain agent.
"""

from __future__ import annotations

try:
    import pydantic_ai  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the Pydantic AI adapter needs pydantic-ai: pip install 'agentruns[pydantic-ai]'"
    ) from exc

import contextvars
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic_ai import Agent, ToolApproved, ToolDenied
from pydantic_ai.durable_exec import (
    JSON_CODEC,
    BaseDurabilityCapability,
    CallableOperationBackend,
    DurabilityEngineSpec,
    ModelCompactMessagesId,
    ModelRequestId,
    RoleBasedOperationConfig,
    ToolsetCallToolId,
    conversation_id_from_run_id,
    record_durable_unit,
    replay_scope,
)
from pydantic_ai.exceptions import ModelAPIError, UserError
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import AgentDepsT, DeferredToolRequests, DeferredToolResults

from workers.context import current_run
from workers.errors import Fatal
from workers.frameworks.bridge import Bridge, tool_threads
from workers.frameworks.pydantic_ai_steps import (
    DEFAULT_OPTIONS,
    NAME_MAX,
    TOOL_METADATA_KEY,
    StepNamer,
    StepOptions,
    approval_proposal,
    denial,
    engine_error,
    tool_options,
    with_usage,
)
from workers.llm import capacity
from workers.values import Decision

if TYPE_CHECKING:
    from pydantic_ai.agent import AbstractAgent
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.tools import RunContext as AgentRunContext

    from workers.context import RunContext

__all__ = ["AgentRunsDurability", "StepOptions", "run_agent", "run_async"]


class AgentRunsDurability(BaseDurabilityCapability[AgentDepsT]):
    """Makes every model request and tool call of a Pydantic AI agent a checkpointed step of the run.

    Give it to an agent built with a ``name`` (Pydantic AI asks durable agents
    for one) and a model, and run the agent with ``run_agent(ctx, agent, ...)``
    (or ``run_async``). Run any other way by a kind's code (``agent.run_sync()``
    between steps) it raises ``UserError`` before its first model request;
    inside a step (a tool of a durable agent, a ``ctx.step``) it is part of that
    step, which records what it returns; outside any run it is a plain agent. Model requests are ``kind=llm`` steps "Thinking (iteration N)" with the tokens the provider reported and
    their cost from ``RUNS_LLM_PRICES``; tool calls are ``kind=tool`` steps
    "Calling <tool>", configured per tool by ``StepOptions`` in its metadata; a
    tool that requires approval (``requires_approval=True``, or one that raises
    ``ApprovalRequired``) asks a person with ``ctx.approval("Approve <tool>")``,
    and a rejection is told to the model. ``models`` registers further models
    (by key) a run may switch to with ``run_agent(..., model=key)``.
    """

    engine_spec: ClassVar = DurabilityEngineSpec(
        engine_name="agentruns",
        durable_unit_noun="step",
        durable_container_noun="run",
        codec=JSON_CODEC,
        serialization_failure=lambda exc: Fatal(
            f"a result Pydantic AI cannot store as JSON: {exc}"
        ),
        # One step at a time, in the order asked, so that replay meets them in the same order.
        sequential_tools_in_durable_context=True,
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        tool_config_key=TOOL_METADATA_KEY,
    )

    def __init__(self, *, models: Mapping[str, Any] | None = None, name: str | None = None) -> None:
        super().__init__(models=models, name=name)

    @property
    def in_durable_context(self) -> bool:
        # Inside a step (an agent run by a tool) the enclosing step records everything.
        return _SESSION.get() is not None and not _IN_STEP.get()

    async def before_run(self, ctx: AgentRunContext[AgentDepsT]) -> None:
        # Pydantic AI asks every capability before the run's first model request. Started by a kind's
        # code without run_agent, its calls would not be steps: refused, rather than a run that looks
        # durable and is not. Outside any run (a script, a unit test of the agent) it runs as a plain agent.
        if _SESSION.get() is None and current_run() is not None:
            raise UserError(
                f"agent {self.name!r} has AgentRunsDurability: run it with "
                "workers.frameworks.pydantic_ai.run_agent(ctx, agent, ...), not agent.run() or "
                "agent.run_sync(), so that its model requests and tool calls are steps of the run"
            )
        await super().before_run(ctx)

    def get_durable_operation_backend(self) -> _StepBackend:
        return _StepBackend(self.name)

    def get_default_run_id(self) -> str | None:
        # Replay-stable: recorded responses carry it, and new_messages() goes by it.
        session = _SESSION.get() if self.in_durable_context else None
        if session is None:
            return None
        # Counted per attempt of the run, which replays its agent runs in the same order.
        count = _AGENT_RUNS[session.ctx] = _AGENT_RUNS.get(session.ctx, 0) + 1
        return f"{session.ctx.run_id}:{count}"

    def get_default_conversation_id(self, run_id: str) -> str | None:
        return conversation_id_from_run_id(run_id) if self.in_durable_context else None

    async def handle_deferred_tool_calls(
        self, ctx: AgentRunContext[AgentDepsT], *, requests: DeferredToolRequests
    ) -> DeferredToolResults | None:
        """Each call awaiting approval becomes ``ctx.approval``; calls deferred for other reasons stay deferred."""
        session = _SESSION.get() if self.in_durable_context else None
        if session is None or not requests.approvals:
            return None
        answers: dict[str, bool | ToolApproved | ToolDenied] = {}
        for call in requests.approvals:
            decision = await session.approval(call, requests.metadata.get(call.tool_call_id))
            answers[call.tool_call_id] = True if decision.approved else ToolDenied(denial(decision))
        return DeferredToolResults(approvals=answers)


def run_agent(
    ctx: RunContext, agent: AbstractAgent[Any, Any], user_prompt: Any = None, /, **run_kwargs: Any
) -> AgentRunResult[Any]:
    """Run ``agent`` (which has ``AgentRunsDurability``) as part of run ``ctx``; returns its ``AgentRunResult``.

    Takes the arguments of ``agent.run``. Every model request and tool call is a
    step: after a crash or a release the kind runs again from the top, and the
    agent gets the recorded responses and tool results back without calling
    anything, up to the step that did not finish. The agent must not depend on
    anything else that changes between attempts (deps, prompts, the clock).
    """
    if AgentRunsDurability.from_agent(agent) is None:
        raise UserError(
            "run_agent() needs an agent built with capabilities=[AgentRunsDurability()]"
        )
    return run_async(ctx, agent.run, user_prompt, **run_kwargs)


def run_async(
    ctx: RunContext, fn: Callable[..., Awaitable[Any]], /, *args: Any, **kwargs: Any
) -> Any:
    """``await fn(*args, **kwargs)`` on the worker's event loop for frameworks, with the units of run ``ctx``.

    For what ``run_agent`` does not cover (``agent.iter``, several agents in one
    coroutine). Call it from the kind's own thread; a suspension of the run
    (an approval, a release) or a failed step stops the coroutine and is raised here.
    """
    if _SESSION.get() is not None:
        raise UserError("run_async() cannot be nested in another run_async()")
    session = _Session(ctx)

    async def main() -> Any:
        _SESSION.set(session)  # in the agent's task, and the tasks it starts
        with replay_scope(), Agent.using_thread_executor(tool_threads()):
            return await fn(*args, **kwargs)

    return session.bridge.run(main)


# The durable units as steps.


class _StepBackend(CallableOperationBackend[StepOptions]):
    """Each durable unit Pydantic AI asks for is one ``ctx.step`` of the run."""

    def __init__(self, agent_name: str) -> None:
        options = RoleBasedOperationConfig(
            model=DEFAULT_OPTIONS,
            event=DEFAULT_OPTIONS,
            capability=DEFAULT_OPTIONS,
            tool=DEFAULT_OPTIONS,
            resolve_tool=tool_options,
        )
        super().__init__(namer=StepNamer(agent_name), config=options)

    async def execute(
        self,
        *,
        operation_id: Any,
        name: str,
        body: Callable[[], Awaitable[object]],
        cache_key: tuple[object, ...],
        config: StepOptions,
    ) -> object:
        session = _SESSION.get()
        if session is None or _IN_STEP.get():
            return await body()
        return await session.unit(operation_id, name, body, config or DEFAULT_OPTIONS, cache_key)


# One run_async() of a run: its steps, asked for on the event loop and made on the run's thread.

_SESSION: contextvars.ContextVar[_Session | None] = contextvars.ContextVar(
    "agentruns_pydantic_ai", default=None
)
_IN_STEP: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "agentruns_pydantic_ai_in_step", default=False
)
# Agent runs started by each execution of a run (RunContext), for their replay-stable ids.
_AGENT_RUNS: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


class _Session:
    """The units of one ``run_async`` as steps of run ``ctx``, through a ``Bridge`` to the run's thread."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.bridge = Bridge(f"the Pydantic AI agent of run {ctx.run_id}")
        self.model_calls = 0

    # On the event loop.
    async def unit(
        self,
        operation_id: Any,
        name: str,
        body: Callable[[], Awaitable[object]],
        options: StepOptions,
        cache_key: tuple[object, ...],
    ) -> object:
        # The unit runs in the agent's context (its run context, its thread executor), not the step thread's.
        context = contextvars.copy_context()
        kind, model = "custom", ""
        describe: dict[str, Any] = {}
        if isinstance(operation_id, ModelRequestId | ModelCompactMessagesId):
            kind, model = "llm", operation_id.model_name
            describe = {"model": model}
        elif isinstance(operation_id, ToolsetCallToolId):
            kind = "tool"
            # For the audit trail only: the call's arguments, where the cache key has them.
            if len(cache_key) > 1 and isinstance(cache_key[1], dict):
                describe = {"arguments": cache_key[1]}

        def do() -> tuple[Any, bool]:
            step_name = name
            if isinstance(operation_id, ModelRequestId):  # counted here, in the order the steps run
                self.model_calls += 1
                step_name = f"{name} (iteration {self.model_calls})"
            return self._step(
                step_name, body, context, kind=kind, options=options, model=model, describe=describe
            )

        value, executed = await self.bridge.call(do)
        record_durable_unit(
            executed=executed
        )  # a replayed unit's spans and metrics stay out of telemetry
        return value

    def _unit(self, body: Callable[[], Awaitable[object]], timeout: Any, context: Any) -> Any:
        try:
            return self.bridge.wait(lambda: _as_unit(body), timeout, context=context)
        except ModelAPIError as exc:
            raise engine_error(exc) from exc

    async def approval(self, call: ToolCallPart, metadata: Any) -> Decision:
        proposal = approval_proposal(call, metadata)
        return await self.bridge.call(
            lambda: self.ctx.approval(f"Approve {call.tool_name}"[:NAME_MAX], proposal=proposal)
        )

    # On the run's thread.
    def _step(
        self,
        name: str,
        body: Callable[[], Awaitable[object]],
        context: contextvars.Context,
        *,
        kind: str,
        options: StepOptions,
        model: str,
        describe: dict,
    ) -> tuple[Any, bool]:
        executed = False
        timeout = self.ctx.step_timeout(options.timeout)

        def execute(**_described: Any) -> Any:
            nonlocal executed
            executed = True
            if kind != "llm":
                return self._unit(body, timeout, context)
            provider, _, name = model.rpartition(":")  # "openai:gpt-4o", or a bare model name
            with capacity.model_call(
                self.ctx, provider=provider, model=name, prompt=describe, max_tokens=None
            ) as reported:
                payload = self._unit(body, timeout, context)
                result = with_usage(payload, model)
                reported.tokens = result.tokens_in + result.tokens_out
            return result

        keyed = options.side_effect if options.idempotency_key is None else options.idempotency_key
        value = self.ctx.step(
            name,
            execute,
            kind=kind,
            side_effect=options.side_effect,
            idempotency_key=True if keyed else None,
            timeout=timeout,
            kwargs=describe,
        )
        return value, executed


async def _as_unit(body: Callable[[], Awaitable[object]]) -> object:
    _IN_STEP.set(True)
    return await body()
