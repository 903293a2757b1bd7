"""What a turn's model is shown of its conversation: bounded, this turn's own messages left to the prompt."""

from __future__ import annotations

from types import SimpleNamespace

from workers.llm.loop import HISTORY_CHARS, HISTORY_LINES, thread_context


class Turn:
    """What thread_context reads of a RunContext: the thread, its state and its history."""

    def __init__(self, turn: int, lines: list[dict], state: dict | None = None):
        self.thread = SimpleNamespace(turn=turn)
        self.state = state or {}
        self._lines = lines
        self.asked: list[int] = []

    def history(self, *, limit: int) -> list[dict]:
        self.asked.append(limit)
        return self._lines[-limit:]


def line(n: int, *, turn: int, role: str = "user", size: int = 10) -> dict:
    return {"role": role, "turn": turn, "text": f"{n:04d}" + "x" * (size - 4)}


def test_older_lines_are_cut_and_the_state_stands_for_them():
    lines = [line(n, turn=1 + n // 10, role="user" if n % 2 else "assistant") for n in range(300)]
    ctx = Turn(31, lines, state={"goal": "refund", "facts": ["order 1042"]})
    shown = thread_context(ctx)
    assert ctx.asked == [HISTORY_LINES]  # never the whole conversation
    preface, *rest = shown
    assert preface["role"] == "system"
    assert '"goal": "refund"' in preface["content"]
    assert [m["content"][:4] for m in rest] == [f"{n:04d}" for n in range(260, 300)]


def test_the_characters_are_bounded_too_and_this_turns_messages_are_left_out():
    big = HISTORY_CHARS // 3
    lines = [
        line(1, turn=1, size=big),
        line(2, turn=1, role="assistant", size=big),
        line(3, turn=2, size=big),
        line(4, turn=2, role="assistant", size=big),
        line(5, turn=3, size=50),  # this turn's: its prompt carries it
    ]
    shown = thread_context(Turn(3, lines))
    texts = [m["content"][:4] for m in shown[1:]]
    assert texts == ["0002", "0003", "0004"]
    assert "1 earlier lines of the conversation are not shown" in shown[0]["content"]
    assert sum(len(m["content"]) for m in shown[1:]) <= HISTORY_CHARS
