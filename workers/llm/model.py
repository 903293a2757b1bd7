"""What every chat model adapter is: the ``ChatModel`` interface and the ``Completion`` it answers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

# Called with each new piece of the assistant's text, in order, while a call runs.
TextSink = Callable[[str], None]

# A scripted model's brain: (conversation, tool specs) -> {"content": ..., "tool_calls": [{"name", "arguments"}]}.
Script = Callable[[list[dict], list[dict]], dict]


@dataclass(frozen=True)
class Completion:
    """One model answer: the assistant message (Chat Completions form), its usage and its cost."""

    message: dict
    tokens_in: int
    tokens_out: int
    cost_cents: Decimal
    model: str
    finish_reason: str = ""


class ChatModel:
    """The interface of a chat model: ``complete`` one turn of a conversation.

    ``provider`` and ``model`` name it; ``describe()`` is what a run
    records at its start, so the run keeps its model when settings change.
    """

    provider = ""
    model = ""

    def complete(
        self,
        messages: list[dict],
        *,
        tools: list[dict],
        max_tokens: int | None,
        timeout: float | None,
        on_text: TextSink | None = None,
    ) -> Completion:
        """Answer the next assistant turn of ``messages``, which may call ``tools``.

        With ``on_text``, each new piece of the assistant's text is passed to
        it as it arrives (deltas, in order; their concatenation is the
        message's content); the ``Completion`` returned is the same as
        without it. An exception ``on_text`` raises fails the call.
        """
        raise NotImplementedError

    def describe(self) -> dict:
        return {"provider": self.provider, "model": self.model}
