"""Chat models behind one small interface: OpenAI-compatible servers, Anthropic, and a scripted stand-in.

Conversations use the OpenAI Chat Completions message format (``role``,
``content``, ``tool_calls``, ``tool_call_id``) whatever the provider; each
adapter translates at its edge. Adapters never retry: their SDK's retries
are off, and a failure reaches the engine's classifier (``workers.classify``)
as the SDK raised it, so a 429 waits its Retry-After, a 5xx is retried with
backoff and a 400 fails the run at once.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from workers.errors import Fatal, Retryable
from workers.llm import conf, pricing
from workers.llm.model import ChatModel, Completion, Script, TextSink

_clients: dict[tuple, Any] = {}
_clients_lock = threading.Lock()


class OpenAIChat(ChatModel):
    """Chat Completions with tool calling on the official ``openai`` SDK (OpenAI, vLLM, Ollama, llama.cpp...).

    ``base_url``, ``api_key`` and ``model`` default to ``LLM_BASE_URL``,
    ``LLM_API_KEY`` and ``LLM_MODEL``. The SDK's own retries are off.
    With ``on_text`` the answer is streamed (``stream=True``, usage
    included) and put together into the same ``Completion``.
    """

    provider = "openai"

    def __init__(
        self, model: str | None = None, *, base_url: str | None = None, api_key: str | None = None
    ):
        self.model = model or conf.get("LLM_MODEL") or "gpt-4o-mini"
        self.base_url = base_url or conf.get("LLM_BASE_URL") or None
        # Local servers ignore the key, but the SDK insists on one.
        self.api_key = api_key or conf.get("LLM_API_KEY") or "not-needed"

    def _client(self):
        from openai import OpenAI

        key = (self.base_url, self.api_key)
        with _clients_lock:
            client = _clients.get(key)
            if client is None:
                client = _clients[key] = OpenAI(
                    base_url=self.base_url, api_key=self.api_key, max_retries=0
                )
        return client

    def _max_tokens_parameter(self) -> str:
        # OpenAI's own API wants max_completion_tokens (reasoning models refuse
        # max_tokens); compatible servers know max_tokens.
        host = urlsplit(self.base_url or "https://api.openai.com").hostname or ""
        return "max_completion_tokens" if host.endswith("openai.com") else "max_tokens"

    def complete(self, messages, *, tools, max_tokens, timeout, on_text=None) -> Completion:
        params: dict[str, Any] = {"model": self.model, "messages": messages}
        if tools:
            params["tools"] = tools
        if max_tokens:
            params[self._max_tokens_parameter()] = max_tokens
        if timeout:
            params["timeout"] = timeout
        if on_text is None:
            return self._completion(_Answer.of(self._client().chat.completions.create(**params)))
        # The SDK's timeout bounds each read, not the answer: a server that
        # trickles would keep this thread long after its step gave up.
        deadline = time.monotonic() + timeout if timeout else None
        streamed = _StreamedAnswer(on_text)
        with self._client().chat.completions.create(
            **params, stream=True, stream_options={"include_usage": True}
        ) as stream:
            for chunk in stream:
                if deadline is not None and time.monotonic() > deadline:
                    raise Retryable(f"the model was still answering after {timeout:.1f} s")
                streamed.add(chunk)
        return self._completion(streamed.finish())

    def _completion(self, answer: _Answer) -> Completion:
        usage = answer.usage
        tokens_in = (usage.prompt_tokens or 0) if usage else 0
        tokens_out = (usage.completion_tokens or 0) if usage else 0
        cost = pricing.cost_cents(answer.model, tokens_in, tokens_out, fallback=self.model)
        if not answer.chosen:
            raise Retryable(
                "the model answered without a choice",
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost_cents=float(cost),
            )
        if answer.refusal or answer.finish_reason == "content_filter":
            raise Fatal(
                f"the model refused: {answer.refusal or 'content filter'}",
                tokens_in=tokens_in,
                tokens_out=tokens_out,
                cost_cents=float(cost),
            )
        added: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            added["tool_calls"] = answer.tool_calls
        return Completion(
            added, tokens_in, tokens_out, cost, answer.model or self.model, answer.finish_reason
        )


@dataclass
class _Answer:
    """What a Chat Completions call answered: its first choice, usage and model."""

    model: str = ""
    usage: Any = None
    chosen: bool = False  # the answer had a choice
    content: str | None = None
    refusal: str = ""
    finish_reason: str = ""
    tool_calls: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, response) -> _Answer:
        answer = cls(model=response.model or "", usage=response.usage)
        if response.choices:
            choice = response.choices[0]
            message = choice.message
            answer.chosen = True
            answer.finish_reason = choice.finish_reason or ""
            answer.content = message.content
            answer.refusal = getattr(message, "refusal", None) or ""
            answer.tool_calls = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": call.function.arguments or "",
                    },
                }
                for call in message.tool_calls or []
                if getattr(call, "function", None) is not None
            ]
        return answer


class _StreamedAnswer:
    """An ``_Answer`` put together from a stream's chunks, passing the text on as it comes."""

    def __init__(self, on_text: TextSink) -> None:
        self.on_text = on_text
        self.answer = _Answer()
        self.texts: list[str] | None = (
            None  # None until a chunk carries content (a tool call answer may not)
        )
        self.refusals: list[str] = []
        # Tool call deltas come by index: the id and name first, then the arguments in pieces.
        self.calls: dict[int, dict[str, str]] = {}

    def add(self, chunk) -> None:
        answer = self.answer
        answer.model = chunk.model or answer.model
        answer.usage = chunk.usage or answer.usage  # the last chunk, without choices, carries it
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            answer.chosen = True
            answer.finish_reason = choice.finish_reason or answer.finish_reason
            delta = choice.delta
            if delta.content is not None:
                self.texts = self.texts if self.texts is not None else []
                if delta.content:
                    self.texts.append(delta.content)
                    self.on_text(delta.content)
            if delta.refusal:
                self.refusals.append(delta.refusal)
            for piece in delta.tool_calls or []:
                if piece.function is None and piece.index not in self.calls:
                    continue  # as a response's tool call without a function is left out
                call = self.calls.setdefault(piece.index, {"id": "", "name": "", "arguments": ""})
                call["id"] = call["id"] or piece.id or ""
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""

    def finish(self) -> _Answer:
        answer = self.answer
        answer.content = None if self.texts is None else "".join(self.texts)
        answer.refusal = "".join(self.refusals)
        answer.tool_calls = [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
            for _, call in sorted(self.calls.items())
        ]
        return answer


class ScriptedModel(ChatModel):
    """A deterministic offline model: a ``script`` function decides each turn from the conversation.

    It drives the same loop, tools and checkpoints as a real model, reports
    token counts estimated from the text (4 characters a token), and is
    priced as the model ``scripted`` in the price table. Its latency is
    scaled by ``RUNS_DEMO_DELAY_SCALE``. Without a script it answers the
    last user message.
    """

    provider = "scripted"

    def __init__(
        self, script: Script | None = None, *, model: str = "scripted", latency: float = 0.4
    ):
        self.script = script
        self.model = model
        self.latency = latency

    def complete(self, messages, *, tools, max_tokens, timeout, on_text=None) -> Completion:
        reply = (self.script or echo_script)(messages, tools)
        turn = 1 + sum(1 for m in messages if m.get("role") == "assistant")
        message = to_assistant_message(reply, turn=turn)
        # With on_text the latency is spread over a few pieces of the text, as a streaming server would.
        pieces = _word_chunks(message["content"] or "", 4) if on_text is not None else []
        latency = self.latency * settings.RUNS_DEMO_DELAY_SCALE
        for piece in pieces:
            time.sleep(latency / len(pieces))
            on_text(piece)
        if not pieces:
            time.sleep(latency)
        tokens_in = pricing.estimate_tokens(messages) + (
            pricing.estimate_tokens(tools) if tools else 0
        )
        tokens_out = pricing.estimate_tokens(message)
        if max_tokens:
            tokens_out = min(tokens_out, max_tokens)
        cost = pricing.cost_cents(self.model, tokens_in, tokens_out)
        return Completion(
            message,
            tokens_in,
            tokens_out,
            cost,
            self.model,
            "tool_calls" if "tool_calls" in message else "stop",
        )


def _word_chunks(text: str, count: int) -> list[str]:
    """``text`` cut between words into at most ``count`` pieces that join back to it."""
    words = re.split(r"(?<=\s)(?=\S)", text) if text else []
    size = -(-len(words) // count) if words else 1
    return ["".join(words[i : i + size]) for i in range(0, len(words), size)]


def to_assistant_message(reply: dict, *, turn: int) -> dict:
    """A script's reply (``content`` and ``tool_calls`` of ``{"name", "arguments"}``) as an assistant message."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
    calls = []
    for index, call in enumerate(reply.get("tool_calls") or [], start=1):
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": f"call_{turn}_{index}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": arguments
                    if isinstance(arguments, str)
                    else json.dumps(arguments, ensure_ascii=False),
                },
            }
        )
    if calls:
        message["tool_calls"] = calls
    return message


def echo_script(messages: list[dict], tools: list[dict]) -> dict:
    last = next((m.get("content") for m in reversed(messages) if m.get("role") == "user"), "") or ""
    return {"content": f"(scripted model) You said: {last}"}


def choose_model(
    model: ChatModel | str | None = None, *, script: Script | None = None
) -> ChatModel:
    """The model a run that starts now uses: ``model`` itself, a model name for the configured provider, or the default.

    The provider is ``LLM_PROVIDER`` when set, else ``openai`` when
    ``LLM_BASE_URL`` is set, else the scripted model driven by ``script``.
    """
    if isinstance(model, ChatModel):
        return model
    return model_for(conf.provider(), model, script=script)


def model_for(provider: str, model: str | None, *, script: Script | None = None) -> ChatModel:
    """The adapter for a provider name and model (as recorded at a run's start)."""
    if provider == "scripted":
        return ScriptedModel(script, model=model or "scripted")
    if provider == "openai":
        return OpenAIChat(model)
    if provider == "anthropic":
        from workers.llm.anthropic_chat import AnthropicChat

        return AnthropicChat(model)
    raise ImproperlyConfigured(
        f"unknown LLM provider {provider!r}: use openai, anthropic or scripted"
    )
