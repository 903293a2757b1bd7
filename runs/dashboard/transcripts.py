"""Model calls of the LLM loop as transcripts: the messages each call added, its tool calls and their results.

A model step stores only its reply (a step stores the
messages it added, not the whole conversation again), so the messages sent
with a call are rebuilt from the steps between it and the previous call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from runs.actors import sentence_start
from runs.dashboard.rendering import as_text, cut, readable

# Transcripts of model calls --------------------------------------------------


@dataclass(frozen=True)
class ToolCallView:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TranscriptEntry:
    """One message of a model call: ``role`` is system, user, assistant or tool."""

    role: str
    label: str
    text: str = ""
    calls: list[ToolCallView] = field(default_factory=list)
    error: bool = False
    seq: int | None = None  # the step that recorded it
    artifact_id: int | None = None


@dataclass(frozen=True)
class Transcript:
    """A model call of the LLM loop: the messages added since the previous call, then its answer."""

    seq: int
    model: str
    iteration: int | None
    sent: int | None  # messages in the conversation it was sent
    earlier: int  # of them, shown with earlier calls
    tokens_in: int
    tokens_out: int
    cost_cents: Decimal
    entries: list[TranscriptEntry]
    answered: bool


def transcript(
    step: Any, steps: Iterable[Any] = (), names: Mapping[str, str] | None = None
) -> Transcript | None:
    """The transcript of an ``llm`` step of the LLM loop, or None for any other step.

    ``names`` maps the authors of people's messages ("user:7") to names
    (``runs.actors.describe_actors``); an author without one is "a person".

    ``steps`` are the run's steps (or timeline items with a ``.step``) in
    order: a model step stores only the message it added, so the messages
    before it (the prompts, tool results, people's messages) are read from
    the steps that recorded them. Without ``steps`` only the answer shows.
    """
    step = getattr(step, "step", step)
    request = _request(step)
    if step.kind != "llm" or request is None:
        return None
    ordered = [getattr(s, "step", s) for s in steps]
    position = next((i for i, s in enumerate(ordered) if s.seq == step.seq), None)
    added = _added_before(ordered[:position], names or {}) if position is not None else []
    entries = list(added)
    reply = (
        step.output
        if isinstance(step.output, dict) and step.output.get("role") == "assistant"
        else None
    )
    if reply is not None:
        calls = [
            _call_view(call) for call in reply.get("tool_calls") or [] if isinstance(call, dict)
        ]
        content = reply.get("content")
        text = content if isinstance(content, str) else "" if content is None else as_text(content)
        entries.append(TranscriptEntry("assistant", "Model", cut(text), calls, seq=step.seq))
    sent = request.get("messages") if isinstance(request.get("messages"), int) else None
    return Transcript(
        seq=step.seq,
        model=str(request.get("model") or ""),
        iteration=request.get("iteration"),
        sent=sent,
        earlier=max(0, (sent or 0) - len(added)),
        tokens_in=step.tokens_in or 0,
        tokens_out=step.tokens_out or 0,
        cost_cents=step.cost_cents or Decimal(0),
        entries=entries,
        answered=reply is not None,
    )


def _request(step: Any) -> dict | None:
    """The loop's record of a model call: ``{"model", "iteration", "messages": <count>, "tools"}``."""
    request = (
        ((step.input or {}).get("kwargs") or {}).get("request")
        if isinstance(step.input, dict)
        else None
    )
    return request if isinstance(request, dict) and "model" in request else None


def _added_before(earlier: list[Any], names: Mapping[str, str]) -> list[TranscriptEntry]:
    """The messages that joined the conversation after the last model call (or the start) in ``earlier``."""
    start = 0
    pending: list[dict] = []
    entries: list[TranscriptEntry] = []
    for index in range(len(earlier) - 1, -1, -1):
        step = earlier[index]
        if step.kind == "llm" and _request(step) is not None:
            start = index + 1
            output = step.output if isinstance(step.output, dict) else {}
            pending = [c for c in output.get("tool_calls") or [] if isinstance(c, dict)]
            break
        if (
            step.name == "Starting the agent"
            and isinstance(step.output, dict)
            and "system" in step.output
        ):
            start = index + 1
            entries.append(
                TranscriptEntry(
                    "system", "System prompt", cut(as_text(step.output["system"])), seq=step.seq
                )
            )
            # Runs started before the loop recorded the prompt have it only in their input.
            user = step.output.get("user")
            text = (
                cut(user)
                if isinstance(user, str)
                else "(not recorded for this run: see the run's input)"
            )
            entries.append(TranscriptEntry("user", "User", text, seq=step.seq))
            break
    for step in earlier[start:]:
        if step.status != "done":
            continue
        if step.kind == "tool" and isinstance(step.output, dict):
            call = pending.pop(0) if pending else {}
            name = (
                ((step.input or {}).get("kwargs") or {}).get("call", {}).get("name")
                if isinstance(step.input, dict)
                else None
            )
            name = name or (call.get("function") or {}).get("name") or "a tool"
            entries.append(
                TranscriptEntry(
                    "tool",
                    f"Result of {name}",
                    readable(step.output.get("content")),
                    error=bool(step.output.get("error")),
                    seq=step.seq,
                    artifact_id=step.output.get("artifact_id"),
                )
            )
        elif (
            step.kind == "approval"
            and isinstance(step.output, dict)
            and step.output.get("approved") is False
        ):
            call = pending.pop(0) if pending else {}
            name = (call.get("function") or {}).get("name") or "the call"
            comment = step.output.get("comment") or ""
            who = sentence_start(as_text(step.output.get("by_name")) or "a person")
            # What the loop told the model (workers/llm/loop.py), in its words.
            told = (
                f"{who} rejected this call"
                + (f": {comment}" if comment else "")
                + ". Do not retry it."
            )
            entries.append(
                TranscriptEntry("tool", f"Result of {name}", told, error=True, seq=step.seq)
            )
        elif step.kind == "message" and isinstance(step.output, list):
            for message in step.output:
                if isinstance(message, dict):
                    entries.append(
                        TranscriptEntry(
                            "user",
                            f"Message from {names.get(as_text(message.get('author')), 'a person')}",
                            cut(as_text(message.get("text"))),
                            seq=step.seq,
                        )
                    )
    return entries


def _call_view(call: dict) -> ToolCallView:
    function = call.get("function") or {}
    return ToolCallView(
        id=str(call.get("id") or ""),
        name=str(function.get("name") or ""),
        arguments=readable(function.get("arguments") or "{}"),
    )
