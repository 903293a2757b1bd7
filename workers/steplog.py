"""The step log of one execution of a run: which position each durable operation takes, and the replay check.

Every durable operation of ``RunContext`` (a step, ``now``/``uuid``, sleep,
spawn, gather, an approval, messages, a saga's compensations) takes a
position (``seq``) here, and nowhere else. ``StepLog`` owns:

- the sequence numbers: the last position taken, the next one, and the end
  of the log (the last position taken or recorded, after which a rollback
  writes its compensations);
- the replay lookup: what the run's log (loaded once per claim) recorded at
  a position, and what this execution checkpointed since;
- the one nondeterminism check: a position recorded under another name than
  the operation now asks for raises ``NonDeterministic`` (the run fails
  ``nondeterministic``), naming both.

Positions only move forward. An operation that must look before it commits
(a spawn names its child after its position, a wait reads the messages
before it decides to record anything) ``peek``s, then ``commit``s that very
position; one that writes at a position more than once (a sleep's timer,
then its end) takes it once and passes the ``Position`` on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from runs.engine.steplog import RecordedStep
from workers.errors import NonDeterministic


@dataclass(frozen=True)
class Position:
    """A position in the step log, checked against what was recorded there (``recorded``, None if nothing)."""

    seq: int
    name: str
    recorded: RecordedStep | None

    @property
    def finished(self) -> RecordedStep | None:
        """The finished step the position holds, whose output replay returns; None if it holds none."""
        if self.recorded is not None and self.recorded.status == "done":
            return self.recorded
        return None

    @property
    def done(self) -> bool:
        """The position holds a finished step: replay returns its output."""
        return self.finished is not None


class StepLog:
    """Sequence numbers, the replay lookup and the one nondeterminism check of one execution of a run."""

    def __init__(self, recorded: Mapping[int, RecordedStep] | None = None):
        self._recorded: dict[int, RecordedStep] = dict(recorded or {})
        self._last = 0

    @property
    def last_taken(self) -> int:
        """The position of the step in progress or the last one taken (0 before the first)."""
        return self._last

    @property
    def next_seq(self) -> int:
        """The position the next operation will take."""
        return self._last + 1

    @property
    def end(self) -> int:
        """The last position taken or recorded (0 for an empty log): a rollback writes after it."""
        return max(self._last, max(self._recorded, default=0))

    def recorded(self, seq: int) -> RecordedStep | None:
        """What the log holds at ``seq``: loaded at the claim, or checkpointed since."""
        return self._recorded.get(seq)

    def newest_first(self) -> Iterator[RecordedStep]:
        for seq in sorted(self._recorded, reverse=True):
            yield self._recorded[seq]

    def peek(self, name: str, *, what: str = "step") -> Position:
        """The next position for operation ``name``, checked, not taken: ``commit`` it to take it."""
        return self._check(self.next_seq, name, what)

    def commit(self, position: Position) -> Position:
        """Take ``position``, which ``peek`` returned; nothing may have taken a position meanwhile."""
        if position.seq != self.next_seq:
            raise RuntimeError(
                f"step {position.seq} is not the next position ({self.next_seq}): peeked too early"
            )
        self._last = position.seq
        return position

    def take(self, name: str, *, what: str = "step") -> Position:
        """Take the next position for operation ``name`` (``what`` names its sort in a mismatch)."""
        return self.commit(self.peek(name, what=what))

    def take_at(self, seq: int, name: str, *, what: str = "step") -> Position:
        """Take position ``seq``, past the last one taken: a rollback's steps go after the end of the log."""
        if seq <= self._last:
            raise RuntimeError(f"step {seq} is not after the last position taken ({self._last})")
        position = self._check(seq, name, what)
        self._last = seq
        return position

    def note(self, step: RecordedStep) -> None:
        """``step`` was checkpointed at a position taken in this execution."""
        if step.seq > self._last:
            raise RuntimeError(
                f"step {step.seq} was not taken (the last position taken is {self._last})"
            )
        self._recorded[step.seq] = step

    def _check(self, seq: int, name: str, what: str) -> Position:
        recorded = self._recorded.get(seq)
        if recorded is not None and recorded.name != name:
            raise NonDeterministic(seq=seq, recorded=recorded.name, requested=name, what=what)
        return Position(seq=seq, name=name, recorded=recorded)
