"""The workflow operations of ``RunContext``: durable sleep, timed waits, child runs, approvals, messages.

Each is a recorded step, so a replay returns what the first execution saw:
a finished sleep is skipped, a spawn finds the child it made, a gather
returns the outcomes it recorded, an approval the decision. While a run
sleeps or waits it holds no worker, slot, lease or connection
(``runs.engine.timers``, ``runs.engine.family``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from uuid import UUID

from runs.db import dumps, release_connection
from runs.engine import family, marks, timers
from runs.engine import steps as checkpoint
from runs.engine.steplog import unconsumed_messages
from runs.events import Actor
from runs.exceptions import IdempotencyConflict, InvalidRunInput, QueueFull, UnknownKind
from runs.proposals import Proposal
from workers.errors import (
    AwaitApproval,
    AwaitChildren,
    AwaitMessage,
    Fatal,
    Retryable,
    Sleep,
)
from workers.values import ChildOutcome, ChildRun, Decision

if TYPE_CHECKING:
    from collections.abc import Iterable

    from workers.bounds import RunBounds
    from workers.recording import StepRecorder
    from workers.steplog import Position, StepLog


# Longer than any run may wait (expires_at), short of what an interval column holds.
MAX_WAIT_SECONDS = 10 * 365 * 86400


def _seconds(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number of seconds")
    if not 0 <= value <= MAX_WAIT_SECONDS:
        raise ValueError(f"{what} must be between 0 and {MAX_WAIT_SECONDS} seconds (ten years)")
    return float(value)


class Workflow:
    """Sleep, timed waits, child runs, approvals and messages of one execution (``RunContext``'s)."""

    def __init__(self, *, bounds: RunBounds, log: StepLog, recorder: StepRecorder) -> None:
        self._bounds = bounds
        self._log = log
        self._recorder = recorder
        self._claimed = bounds.claim
        self._worker = bounds.worker

    def sleep(self, seconds: float, *, name: str = "sleep") -> None:
        """``RunContext.sleep``."""
        self._sleep(name, seconds=_seconds(seconds, "seconds"), until=None)

    def sleep_until(self, when: datetime, *, name: str = "sleep") -> None:
        """``RunContext.sleep_until``."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise ValueError("sleep_until needs an aware datetime")
        self._sleep(name, seconds=None, until=when)

    def _sleep(self, name: str, *, seconds: float | None, until: datetime | None) -> None:
        position = self._log.take(name, what="sleep")
        recorded = position.recorded
        if position.done:
            return
        if recorded is None:
            self._bounds.before_step(position.seq, "sleep")
            until = self._start_timer(
                position,
                "sleep",
                {"seconds": seconds, "until": until and until.isoformat()},
                seconds=seconds,
                until=until,
            )
        else:
            until = datetime.fromisoformat(recorded.output["until"])
        if self._claimed.claimed_at >= until:
            self._finish_waiting(position, "sleep", {"until": until.isoformat(), "slept": True})
            return
        raise Sleep(f"sleeping until {until.isoformat()}", until=until)

    def wait_for_message(self, *, timeout: float | None = None) -> list[dict]:
        """``RunContext.wait_for_message``."""
        if timeout is not None:
            timeout = _seconds(timeout, "timeout")
        # Looked at before it is taken: with messages waiting, the step that consumes them takes it.
        position = self._log.peek("messages", what="wait for a message")
        recorded = position.recorded
        if not position.done:
            if recorded is None:
                self._bounds.before_step(position.seq, "message")
            try:
                pending = unconsumed_messages(self._claimed.id, limit=1)
            finally:
                release_connection()
            if not pending:
                if recorded is not None and recorded.kind == "message" and recorded.output:
                    until = datetime.fromisoformat(recorded.output["until"])
                    if self._claimed.claimed_at >= until:
                        return self._finish_waiting(
                            self._log.commit(position), "message", [], consumes=True
                        )
                    raise AwaitMessage("waiting for a message", wake_at=until)
                if timeout is None:
                    raise AwaitMessage("waiting for a message")
                until = self._start_timer(
                    position, "message", {"timeout": timeout}, seconds=timeout, until=None
                )
                raise AwaitMessage("waiting for a message", wake_at=until)
        return self.messages()

    # People in the loop.
    def approval(self, name: str, *, proposal: Any) -> Decision:
        """``RunContext.approval``."""
        if isinstance(proposal, Proposal):
            proposal = proposal.to_json()
        position = self._log.take(name, what="approval")
        seq = position.seq
        if (finished := position.finished) is not None:
            return Decision.from_output(finished.output)
        self._bounds.before_step(seq, "approval")
        try:
            dumps(proposal)
        except (TypeError, ValueError) as exc:
            raise Fatal(
                f"the proposal of approval {name!r} is not JSON-serialisable: {exc}"
            ) from None
        record = checkpoint.StepRecord(
            run_id=self._claimed.id,
            token=self._claimed.lease_token,
            generation=self._claimed.generation,
            seq=seq,
            name=name,
            kind="approval",
            input={"proposal": proposal},
            started_at=datetime.now(UTC),
        )
        try:
            written = marks.record_pending(record)
        finally:
            release_connection()
        if not written:
            raise self._bounds.lose_lease(f"lease lost while asking for approval {name!r}")
        raise AwaitApproval(f"waiting for approval of {name!r} (step {seq})")

    def messages(self) -> list[dict]:
        """``RunContext.messages``."""
        return self._recorder.execute(
            "messages",
            unconsumed_messages,
            (self._claimed.id,),
            {},
            kind="message",
            consumes_messages=True,
        )

    # Child runs.
    def spawn(
        self,
        kind: str,
        input: dict,
        *,
        key: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> ChildRun:
        """``RunContext.spawn``."""
        # Named after its position before it is taken (and checked): the step then commits to that position.
        position = self._log.peek(f"spawn {kind}")
        # Per generation: a run retried from an earlier step spawns new children.
        child_key = (
            f"{self._claimed.generation}:{key}"
            if key
            else f"{self._claimed.generation}:{position.seq}"
        )
        budget = self._bounds.budget_left_cents

        def make_child(*, kind: str, input: dict, key: str) -> dict:
            from runs.services import spawn_child  # models: loaded after the app registry

            try:
                made = spawn_child(
                    parent_id=self._claimed.id,
                    kind=kind,
                    input=input,
                    key=key,
                    budget_left_cents=budget,
                    queue=queue,
                    priority=priority,
                )
            except QueueFull as exc:
                raise Retryable(
                    f"cannot spawn {kind!r}: {exc}", retry_after=exc.retry_after
                ) from None
            except (UnknownKind, InvalidRunInput, IdempotencyConflict) as exc:
                raise Fatal(f"cannot spawn {kind!r}: {exc}") from None
            return {"run_id": str(made.run.pk), "kind": kind, "key": child_key}

        output = self._recorder.execute(
            position.name,
            make_child,
            (),
            {"kind": kind, "input": input, "key": child_key},
            at=self._log.commit(position),
            kind="child",
        )
        return ChildRun.from_output(output)

    def gather(
        self,
        children: Iterable[ChildRun | UUID | str],
        *,
        min_success: int | None = None,
        timeout: float | None = None,
        name: str = "gather",
    ) -> list[ChildOutcome]:
        """``RunContext.gather``."""
        ids = [c.run_id if isinstance(c, ChildRun) else UUID(str(c)) for c in children]
        if min_success is not None and (
            isinstance(min_success, bool) or not 1 <= min_success <= len(ids)
        ):
            raise ValueError(
                f"min_success must be between 1 and the number of children ({len(ids)})"
            )
        if timeout is not None:
            timeout = _seconds(timeout, "timeout")
        position = self._log.take(name, what="gather")
        seq = position.seq
        if (finished := position.finished) is not None:
            return [
                ChildOutcome.from_output(o, parent_id=self._claimed.id) for o in finished.output
            ]
        self._bounds.before_step(
            seq, "child"
        )  # with the budget, which what finished children spent counts in
        try:
            state = family.begin_gather(
                run_id=self._claimed.id,
                token=self._claimed.lease_token,
                generation=self._claimed.generation,
                seq=seq,
                name=name,
                children=ids,
                min_success=min_success,
                timeout=timeout,
                worker_id=self._worker.id,
            )
        finally:
            release_connection()
        if state is None:
            raise self._bounds.lose_lease(f"lease lost while gathering children (step {seq})")
        if len(state.children) != len(ids):
            raise Fatal("gather() was given runs that are not children of this run")
        if not state.met and not state.timed_out:
            raise AwaitChildren(f"waiting for {len(state.pending)} children", wake_at=state.until)
        # Stragglers are cancelled before the outcome is recorded: a crash in
        # between finds them cancelled on replay, and records the same.
        stragglers = set(state.pending)
        for child_id in state.pending:
            self._cancel_child(child_id)
        outcomes = [
            c.as_json() | ({"status": "cancelled"} if c.run_id in stragglers else {})
            for c in state.children
        ]
        result = self._finish_waiting(position, "child", outcomes)
        return [ChildOutcome.from_output(o, parent_id=self._claimed.id) for o in result]

    def _cancel_child(self, child_id: UUID) -> None:
        from runs.control import cancel_runs  # models: loaded after the app registry

        try:
            cancel_runs([child_id], actor=Actor(type="worker", id=str(self._worker.id)))
        finally:
            release_connection()

    # Shared by the waiting steps.
    def _start_timer(
        self,
        position: Position,
        kind: str,
        input: Any,
        *,
        seconds: float | None,
        until: datetime | None,
    ) -> datetime:
        seq, name = position.seq, position.name
        try:
            end = timers.start_timer_step(
                run_id=self._claimed.id,
                token=self._claimed.lease_token,
                generation=self._claimed.generation,
                seq=seq,
                name=name,
                kind=kind,
                input=dumps(input),
                seconds=seconds,
                until=until,
                worker_id=self._worker.id,
            )
        finally:
            release_connection()
        if end is None:
            raise self._bounds.lose_lease(f"lease lost while starting step {seq} ({name})")
        return end

    def _finish_waiting(
        self, position: Position, kind: str, output: Any, *, consumes: bool = False
    ) -> Any:
        """Record a waiting step (sleep, timed wait, gather) as done with ``output``, at the position it took."""
        return self._recorder.execute(
            position.name,
            lambda: output,
            (),
            {},
            at=position,
            kind=kind,
            consumes_messages=consumes,
            started_at=_since(position),
        )


def _since(position: Position) -> datetime | None:
    recorded = position.recorded
    if recorded is None or not isinstance(recorded.output, dict) or "since" not in recorded.output:
        return None
    return datetime.fromisoformat(recorded.output["since"]).astimezone(UTC)
