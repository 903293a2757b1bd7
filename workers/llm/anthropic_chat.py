"""The Anthropic Messages adapter (``pip install agentruns[anthropic]``).

Translates the Chat Completions conversation the loop keeps into Messages
API turns (system apart, ``tool_use`` and ``tool_result`` blocks) and the
answer back into an assistant message with ``tool_calls``.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from workers.errors import Fatal
from workers.llm import conf, pricing
from workers.llm.model import ChatModel, Completion

_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


class AnthropicChat(ChatModel):
    """Claude through the official ``anthropic`` SDK, its retries off.

    ``model``, ``base_url`` and ``api_key`` default to ``LLM_MODEL``,
    ``LLM_BASE_URL`` and ``LLM_API_KEY``. The answer is not streamed:
    ``on_text`` is called once, with the whole text, when it has come.
    """

    provider = "anthropic"

    def __init__(
        self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None
    ):
        self.model = model or conf.get("LLM_MODEL") or "claude-haiku-4-5"
        self.base_url = base_url or conf.get("LLM_BASE_URL") or None
        self.api_key = api_key or conf.get("LLM_API_KEY") or "not-needed"

    def _client(self):
        try:
            import anthropic
        except ImportError as exc:  # an optional extra
            raise Fatal(
                "the anthropic provider needs the 'anthropic' package: pip install agentruns[anthropic]"
            ) from exc
        key = (self.base_url, self.api_key)
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = anthropic.Anthropic(
                    base_url=self.base_url, api_key=self.api_key, max_retries=0
                )
        return client

    def complete(self, messages, *, tools, max_tokens, timeout, on_text=None) -> Completion:
        system, turns = to_anthropic(messages)
        params: dict[str, Any] = {
            "model": self.model,
            "messages": turns,
            "max_tokens": max_tokens or conf.get("LLM_MAX_OUTPUT_TOKENS"),
        }
        if system:
            params["system"] = system
        if tools:
            params["tools"] = [
                {
                    "name": t["function"]["name"],
                    "description": t["function"].get("description", ""),
                    "input_schema": t["function"]["parameters"],
                }
                for t in tools
            ]
        if timeout:
            params["timeout"] = timeout
        response = self._client().messages.create(**params)
        tokens_in = response.usage.input_tokens or 0
        tokens_out = response.usage.output_tokens or 0
        cost = pricing.cost_cents(response.model or "", tokens_in, tokens_out, fallback=self.model)
        if response.stop_reason == "refusal":
            raise Fatal(
                "the model refused to answer",
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost_cents=float(cost),
            )
        texts, calls = [], []
        for block in response.content:
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                calls.append(
                    {
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": json.dumps(block.input)},
                    }
                )
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
        if on_text is not None and message["content"]:
            on_text(message["content"])
        if calls:
            message["tool_calls"] = calls
        return Completion(
            message,
            tokens_in,
            tokens_out,
            cost,
            response.model or self.model,
            response.stop_reason or "",
        )


def to_anthropic(messages: list[dict]) -> tuple[str, list[dict]]:
    """(system prompt, Messages API turns) for a Chat Completions conversation."""
    system: list[str] = []
    turns: list[dict] = []

    def add(role: str, blocks: list[dict]) -> None:
        # The Messages API alternates roles: consecutive turns of one role merge.
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "system":
            system.append(content or "")
        elif role == "user":
            add("user", [{"type": "text", "text": content or ""}])
        elif role == "tool":
            add(
                "user",
                [
                    {
                        "type": "tool_result",
                        "tool_use_id": message["tool_call_id"],
                        "content": content or "",
                    }
                ],
            )
        elif role == "assistant":
            blocks: list[dict] = [{"type": "text", "text": content}] if content else []
            for call in message.get("tool_calls") or []:
                try:
                    arguments = json.loads(call["function"]["arguments"] or "{}")
                except ValueError:
                    arguments = {}
                if not isinstance(arguments, dict):
                    arguments = {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": arguments,
                    }
                )
            add("assistant", blocks or [{"type": "text", "text": ""}])
    return "\n\n".join(system), turns
