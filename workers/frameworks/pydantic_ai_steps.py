"""How each durable unit of a Pydantic AI agent is recorded as a step (``workers.frameworks.pydantic_ai``).

Its name (which replay compares), its options (a tool's ``StepOptions``, from its metadata), the
tokens and cost a model step records, how a failed model request is handled (retried or failed),
and what a person is asked to approve and the model told of a rejection.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic_ai.durable_exec import (
    JSON_CODEC,
    CapabilityOperationId,
    EventStreamHandlerId,
    JournalOperationNamer,
    ModelCompactMessagesId,
    ModelRequestId,
    ToolsetCallToolId,
    ToolsetGetInstructionsId,
    ToolsetGetToolsId,
    ToolsetValidateToolArgumentsId,
)
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelHTTPError,
    ModelRequestRejectedError,
    UserError,
)
from pydantic_ai.messages import ModelResponse, ToolCallPart

from runs.actors import sentence_start
from workers.classify import classify, status_kind
from workers.errors import Fatal, Retryable
from workers.llm import pricing
from workers.proposals import UNKNOWN, Change, Proposal
from workers.values import Decision, StepResult

# The key of a tool's metadata that configures its step: {"agentruns": {...}} or False.
TOOL_METADATA_KEY = "agentruns"
NAME_MAX = 200  # Step.name


@dataclass(frozen=True)
class StepOptions:
    """How a tool's calls are recorded, from its metadata: ``Tool(fn, metadata={"agentruns": {...}})``.

    ``side_effect`` writes the step ahead of the call (see ``ctx.step``); such a
    call is keyed (``ctx.idempotency_key``) unless ``idempotency_key`` is False.
    ``timeout`` (seconds) overrides the kind's step timeout. Metadata
    ``{"agentruns": False}`` calls the tool without a step: on replay it runs again.
    """

    side_effect: bool = False
    idempotency_key: bool | None = None
    timeout: float | None = None


DEFAULT_OPTIONS = StepOptions()


class StepNamer(JournalOperationNamer):
    """Step names, which replay compares: renaming one fails the runs in flight as nondeterministic."""

    def operation_name(self, operation_id: Any) -> str:
        match operation_id:
            case ModelRequestId():
                return "Thinking"
            case ModelCompactMessagesId():
                return "Compacting the conversation"
            case EventStreamHandlerId():
                return "Handling an event"
            case ToolsetGetToolsId(toolset_id=toolset_id):
                return f"Listing the tools of {toolset_id}"
            case ToolsetGetInstructionsId(toolset_id=toolset_id):
                return f"Reading the instructions of {toolset_id}"
            case ToolsetValidateToolArgumentsId():
                return "Checking the arguments"
            case ToolsetCallToolId():
                return "Calling a tool"
            case CapabilityOperationId(capability_id=capability_id, operation=operation):
                return f"{capability_id}: {operation}"
        return super().operation_name(operation_id)

    def invocation_name(self, operation_id: Any, *, label: str | None) -> Any:
        name = self.operation_name(operation_id)
        if label and isinstance(operation_id, ToolsetCallToolId):
            name = f"Calling {label}"
        elif label and isinstance(operation_id, ToolsetValidateToolArgumentsId):
            name = f"Checking the arguments of {label}"
        # The value type is Pydantic AI's own; only its name is ours.
        return replace(
            super().invocation_name(operation_id, label=label), operation_name=name[:NAME_MAX]
        )


def tool_options(operation_id: Any, tool: Any, tool_name: str) -> StepOptions | Literal[False]:
    """A tool's ``StepOptions`` from its metadata; False for a tool called without a step."""
    tool_def = getattr(tool, "tool_def", None)
    value = (getattr(tool_def, "metadata", None) or {}).get(TOOL_METADATA_KEY)
    if value is None:
        return DEFAULT_OPTIONS
    if value is False or isinstance(value, StepOptions):
        return value
    if isinstance(value, Mapping):
        try:
            return StepOptions(**value)
        except TypeError:
            pass
    raise UserError(
        f"tool {tool_name!r}: metadata {TOOL_METADATA_KEY!r} must be False or a dict of "
        f"side_effect, idempotency_key, timeout; got {value!r}"
    )


def with_usage(payload: Any, model: str) -> StepResult:
    """A model step's output with the tokens the provider reported and what they cost."""
    try:
        response = JSON_CODEC.load(ModelResponse, payload)
    except Exception:  # a shape this version does not know: recorded without usage
        return StepResult(payload)
    tokens_in, tokens_out = response.usage.input_tokens, response.usage.output_tokens
    cost = pricing.cost_cents(response.model_name or model, tokens_in, tokens_out, fallback=model)
    return StepResult(payload, tokens_in, tokens_out, cost)


def engine_error(exc: ModelAPIError) -> Exception:
    """Pydantic AI's error for a failed model request, as the engine handles it (retried or failed)."""
    if isinstance(exc, ModelHTTPError):
        kind = status_kind(exc.status_code)
    elif isinstance(exc, ModelRequestRejectedError):
        kind = "fatal"
    elif exc.__cause__ is not None:
        kind = classify(exc.__cause__).kind  # the provider SDK's exception
    else:
        kind = "retryable"  # a connection error or a timeout without a cause
    error = Retryable if kind == "retryable" else Fatal
    return error(str(exc), retry_after=exc.retry_after)


def approval_proposal(call: ToolCallPart, metadata: Any) -> Proposal:
    arguments = call.args_as_dict()
    details: dict[str, Any] = {
        "tool": call.tool_name,
        "arguments": arguments,
        "tool_call_id": call.tool_call_id,
    }
    if metadata:
        details["metadata"] = metadata
    changes = [Change(key, UNKNOWN, value) for key, value in arguments.items()]
    return Proposal(summary=f"Call {call.tool_name}", changes=changes, details=details)


def denial(decision: Decision) -> str:
    """What the model is told of a rejected call (the words of workers.llm's loop)."""
    reason = f": {decision.comment}" if decision.comment else ""
    return f"{sentence_start(decision.by_name or 'a person')} rejected this call{reason}. Do not retry it."
