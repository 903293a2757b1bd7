"""What a step of ``DurableRunner`` records of the OpenAI Agents SDK's values, and the values it gives back.

A model step stores the SDK's ``ModelResponse`` as JSON (with the answer as an assistant message,
which the run's page shows as a transcript); a replay rebuilds the same response from it, so the
SDK carries on as if the model had answered. A tool step stores its output as JSON the SDK turns
into the same tool result. Changing what is stored changes what runs in flight replay.
"""

from __future__ import annotations

import json
from typing import Any

from agents import (
    ItemHelpers,
    ModelResponse,
    ToolOutputFileContent,
    ToolOutputImage,
    ToolOutputText,
)
from agents.usage import deserialize_usage, serialize_usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
)
from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

STRUCTURED_OUTPUTS = (ToolOutputText, ToolOutputImage, ToolOutputFileContent)
_OUTPUT_ITEM: TypeAdapter[Any] = TypeAdapter(ResponseOutputItem)


def step_output(response: ModelResponse) -> dict:
    """A model step's record: the answer as an assistant message (shown as a transcript) and the SDK's response."""
    texts = [
        ItemHelpers.extract_text(item) or ""
        for item in response.output
        if isinstance(item, ResponseOutputMessage)
    ]
    calls = [
        {
            "id": item.call_id,
            "type": "function",
            "function": {"name": item.name, "arguments": item.arguments},
        }
        for item in response.output
        if isinstance(item, ResponseFunctionToolCall)
    ]
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    message["response"] = {
        "output": [_dump(item) for item in response.output],
        "usage": serialize_usage(response.usage),
        "response_id": response.response_id,
        "request_id": response.request_id,
    }
    return message


def load_response(data: dict) -> ModelResponse:
    return ModelResponse(
        output=[_load_item(item) for item in data["output"]],
        usage=deserialize_usage(data["usage"]),
        response_id=data.get("response_id"),
        request_id=data.get("request_id"),
    )


def _dump(item: Any) -> Any:
    if hasattr(item, "model_dump"):
        # Only the fields that were set, as the SDK's RunState does, so the item goes back to the API as it came.
        return item.model_dump(mode="json", exclude_unset=True)
    return to_jsonable_python(item, fallback=str)


def _load_item(data: Any) -> Any:
    try:
        return _OUTPUT_ITEM.validate_python(data)
    except ValidationError:
        return data  # an item this openai version does not know: the SDK takes it as a dict


def recordable(output: Any, *, typed: bool) -> Any:
    """A tool's output as JSON that the SDK turns into the same tool result as the output itself.

    Text, JSON data and the SDK's structured outputs keep their meaning; a typed tool's output
    is dumped for its schema; anything else becomes the ``str()`` the SDK would send the model.
    """
    if isinstance(output, str):
        return output
    structured = isinstance(output, STRUCTURED_OUTPUTS) or (
        isinstance(output, list | tuple)
        and output
        and all(isinstance(item, STRUCTURED_OUTPUTS) for item in output)
    )
    if structured or typed:
        return to_jsonable_python(output, fallback=str)
    try:
        if json.loads(json.dumps(output)) == output:
            return output
    except (TypeError, ValueError):
        pass
    return str(output)


def parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments
