"""A turn's conversation (``RunContext``'s): its thread, history, state, reply and close.

A turn of a thread (``runs.threads``) is an ordinary run; what it knows of
its conversation comes through here. The thread's state is constant while
a turn is live (only a turn's end changes it, and one turn is live at a
time), so it is read once per claim, not recorded. Everything that could
differ on a replay is a recorded step: the history (new messages arrive
meanwhile), each state patch and the close (``kind="state"``: applied to
the thread when the turn ends well, never before), and each reply
(``kind="reply"``: written to the conversation once, whatever number of
times the step runs, by its key, the step's generation and position).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from runs.db import dumps, release_connection
from runs.text import find_unstorable
from workers.errors import Fatal

if TYPE_CHECKING:
    from workers.bounds import RunBounds
    from workers.recording import StepRecorder
    from workers.steplog import StepLog

# How many lines ctx.history() returns at most; its default.
HISTORY_MAX = 200
HISTORY_DEFAULT = 50
# A reply's text, as a person's message (runs.threads.MESSAGE_MAX_CHARS).
REPLY_MAX_CHARS = 20_000


@dataclass(frozen=True)
class ThreadInfo:
    """The thread a turn belongs to: ``ctx.thread``."""

    id: UUID
    turn: int  # this turn's number: 1, 2...
    title: str
    policy: str


class Conversation:
    """The thread of one turn, read once per claim; the steps that read or change the conversation."""

    def __init__(self, *, bounds: RunBounds, log: StepLog, recorder: StepRecorder) -> None:
        self._bounds = bounds
        self._log = log
        self._recorder = recorder
        self._claimed = bounds.claim
        self._loaded = False
        self._thread: ThreadInfo | None = None
        self._found: dict[str, Any] = {}
        self._patched: dict[str, Any] = {}

    def _load(self) -> None:
        if self._loaded:
            return
        if self._claimed.thread_id is not None:
            from runs.models import Run  # models: loaded after the app registry

            try:
                row = (
                    Run.objects.filter(pk=self._claimed.id)
                    .values("turn", "thread__title", "thread__state", "thread__policy")
                    .get()
                )
            finally:
                release_connection()
            self._thread = ThreadInfo(
                id=self._claimed.thread_id,
                turn=row["turn"] or 0,  # a run with a thread has a turn (run_turn_iff_thread)
                title=row["thread__title"],
                policy=row["thread__policy"],
            )
            self._found = row["thread__state"] or {}
        self._loaded = True

    def _require(self, what: str) -> ThreadInfo:
        self._load()
        if self._thread is None:
            raise Fatal(f"ctx.{what} is for a turn of a thread, and this run is not one")
        return self._thread

    @property
    def thread(self) -> ThreadInfo | None:
        """``RunContext.thread``."""
        self._load()
        return self._thread

    @property
    def state(self) -> dict[str, Any]:
        """``RunContext.state``: a copy of the state as the turn found it."""
        self._require("state")
        return copy.deepcopy(self._found)

    def update_state(self, patch: dict[str, Any]) -> dict[str, Any]:
        """``RunContext.update_state``."""
        self._require("update_state()")
        if not isinstance(patch, dict) or not all(isinstance(k, str) for k in patch):
            raise TypeError("update_state() takes a dict with string keys")
        _storable(patch, "the state patch")
        recorded = self._recorder.execute(
            "update_state", lambda: {"patch": patch}, (), {}, kind="state"
        )
        self._patched |= recorded.get("patch", {})
        return copy.deepcopy(self._found | self._patched)

    def close_thread(self, summary: str = "") -> None:
        """``RunContext.close_thread``."""
        self._require("close_thread()")
        if not isinstance(summary, str):
            raise TypeError("close_thread() takes a summary string")
        _storable(summary, "the summary")
        self._recorder.execute(
            "close_thread", lambda: {"close": summary[:300]}, (), {}, kind="state"
        )

    def reply(self, text: str) -> int:
        """``RunContext.reply``: the reply's message id."""
        thread = self._require("reply()")
        if not isinstance(text, str) or not text.strip():
            raise TypeError("reply() takes a non-empty string")
        if len(text) > REPLY_MAX_CHARS:
            raise ValueError(f"a reply is at most {REPLY_MAX_CHARS} characters ({len(text)} given)")
        _storable(text, "the reply")
        position = self._log.peek("reply")
        key = f"{self._claimed.generation}:{position.seq}"
        run_id, kind = self._claimed.id, self._claimed.kind

        def say() -> dict[str, Any]:
            from runs.threads.replies import write_reply  # models: loaded after the app registry

            return {"message_id": write_reply(thread.id, run_id, key=key, author=kind, text=text)}

        output = self._recorder.execute(
            "reply", say, (), {}, at=self._log.commit(position), kind="reply"
        )
        return int(output["message_id"])

    def history(self, *, limit: int = HISTORY_DEFAULT) -> list[dict[str, Any]]:
        """``RunContext.history``."""
        thread = self._require("history()")
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= HISTORY_MAX:
            raise ValueError(f"limit must be between 1 and {HISTORY_MAX}")

        def read() -> list[dict[str, Any]]:
            from runs.threads.replies import conversation  # models: loaded after the app registry

            return conversation(thread.id, limit=limit)

        return self._recorder.execute("history", read, (), {}, kind="custom")


def _storable(value: Any, what: str) -> None:
    try:
        dumps(value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what} is not JSON-serialisable: {exc}") from None
    if problem := find_unstorable(value, where=what):
        raise ValueError(problem)
