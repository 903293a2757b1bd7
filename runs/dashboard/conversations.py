"""What the dashboard's conversation pages read and say: a thread's turns with their lines and steps, the
thread list's last activity, and the sentence that tells what a message will do.

The services and the API's reads are ``runs.threads``; these are the page's
own, bounded reads (the newest turns and lines, one query each) and plain
functions of a thread that templates only print and tests can call.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.db.models import OuterRef, Q, Subquery
from django.db.models.fields.json import KT

from runs import selectors
from runs.actors import describe_actors, message_author
from runs.dashboard import run_facts
from runs.models import Message, Run, RunStatus, Step, Thread
from runs.registry import AgentKind
from runs.states import StepKind, ThreadPolicy, ThreadStatus
from runs.threads.turns import AGENT, budget_left, turn_input

# The thread page shows its newest turns and, of those, its newest lines; the API pages through all.
TURNS_SHOWN = 50
LINES_SHOWN = 300

THREAD_STATUS_LABELS: dict[str, str] = {
    ThreadStatus.ASLEEP: "Asleep",
    ThreadStatus.ACTIVE: "Active",
    ThreadStatus.CLOSED: "Closed",
}

# What a message does under each policy while a turn is live, as the New thread form offers them.
POLICY_CHOICES = [
    (ThreadPolicy.INTERLEAVE.value, "Interleave: it goes into the live turn"),
    (ThreadPolicy.ENQUEUE.value, "Enqueue: it starts the next turn, after the live one"),
    (ThreadPolicy.INTERRUPT.value, "Interrupt: the live turn stops, a new one starts"),
    (ThreadPolicy.ROLLBACK.value, "Roll back: the live turn is undone, a new one starts"),
    (ThreadPolicy.REJECT.value, "Reject: it is refused until the live turn ends"),
]

CONFIRM_CLOSE = (
    "No more turns: a live turn is cancelled at its next step, and the thread takes no more "
    "messages. A closed thread cannot be opened again."
)


def thread_status_label(status: str) -> str:
    return THREAD_STATUS_LABELS.get(status, status.capitalize())


def conversation_kinds(kinds: list[AgentKind]) -> list[AgentKind]:
    """Of the kinds a tenant may start, those that can play a thread's turns (``create_thread`` checks the same)."""
    probe = turn_input(Thread(), 1)
    playable = []
    for kind in kinds:
        try:
            kind.validate_input(probe)
        except Exception:  # InvalidAgentInput, or a schema that raises something else
            continue
        playable.append(kind)
    return playable


# The composer's sentence


@dataclass(frozen=True)
class Hint:
    """What a message will do, with and without a mention of the agent (the composer's checkbox)."""

    mention: str
    silent: str
    refused: bool  # the message will be refused whatever the checkbox says (reject, closed)


def _budget_note(thread: Thread) -> str:
    left = budget_left(thread)
    if left is not None and left <= 0:
        return (
            " But the thread's cost ceiling is spent: no new turn can start, so it will be refused."
        )
    return ""


def composer_hint(thread: Thread) -> Hint:
    """The composer's sentence for the thread as it is now, under its policy (``runs.threads`` does what it says)."""
    if thread.status == ThreadStatus.CLOSED:
        closed = "This thread is closed: it takes no more messages."
        return Hint(closed, closed, refused=True)
    following = thread.turns + 1
    if thread.status != ThreadStatus.ACTIVE or thread.live_turn is None:
        return Hint(
            mention=f"Your message starts turn {following}.{_budget_note(thread)}",
            silent="Your message is recorded for the next turn; nothing wakes.",
            refused=False,
        )
    live = thread.live_turn
    policy = thread.policy
    if policy == ThreadPolicy.INTERLEAVE:
        said = f"Your message goes to the live turn {live}, read at its next message step."
    elif policy == ThreadPolicy.ENQUEUE:
        said = (
            f"Your message queues turn {following} to run after turn {following - 1}."
            f"{_budget_note(thread)}"
        )
    elif policy == ThreadPolicy.INTERRUPT:
        said = (
            f"Your message cancels turn {live} at its next step and starts turn {following} "
            f"with every unread message.{_budget_note(thread)}"
        )
    elif policy == ThreadPolicy.ROLLBACK:
        said = (
            f"Your message rolls back turn {live} (its compensations run) then starts turn "
            f"{following}.{_budget_note(thread)}"
        )
    else:
        refused = f"Your message is refused while turn {live} is live."
        return Hint(refused, refused, refused=True)
    # While a turn is live the policy decides, mention or not.
    return Hint(said, said, refused=False)


def delivered_sentence(delivered: str, run: Run | None) -> str:
    """The flash after a message was posted: what became of it (``runs.threads.Posted.delivered``)."""
    turn = run.turn if run is not None else None
    return {
        "live_turn": f"Message sent to the live turn {turn}.",
        "new_turn": f"Message sent: it starts turn {turn}.",
        "queued_turn": f"Message sent: turn {turn} runs after the turns before it.",
        "recorded": "Message recorded for the next turn; the agent was not woken.",
    }.get(delivered, "Message sent.")


# The thread page


@dataclass
class Line:
    """One line of the conversation: a person's message or the agent's reply."""

    message: Message
    author: str
    agent: bool
    unread: bool = False  # a person's message its live turn has not read yet


@dataclass
class TurnView:
    run: Run
    lines: list[Line] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    live: bool = False  # the thread's live turn
    held_behind: int | None = None  # a turn that waits for this earlier one to end
    waiting: dict | None = None  # what a turn that waits for a person waits for

    @property
    def number(self) -> int:
        return self.run.turn or 0

    @property
    def cost(self) -> Decimal:
        """What the turn spent, its child runs included."""
        return self.run.cost_cents + self.run.children_cost_cents

    @property
    def in_progress(self) -> str:
        """A step that is executing but has no row yet (``run_facts.step_in_progress``)."""
        return run_facts.step_in_progress(self.run, self.steps)

    @property
    def working(self) -> str:
        """What the agent is doing in a live turn, in words ("" when it is not working)."""
        status = self.run.status
        if self.held_behind is not None:
            return ""
        if status == RunStatus.QUEUED:
            return "is about to answer (queued for a worker)"
        if status == RunStatus.RUNNING:
            step = self.run.current_step
            return f"is working ({step})" if step else "is working"
        if status == RunStatus.WAITING:
            return "waits for a message or its child runs"
        if status == RunStatus.PAUSED:
            return "is paused"
        return ""


@dataclass
class Conversation:
    turns: list[TurnView]
    pending: list[Line]  # people's messages recorded for the next turn
    earlier_turns: int  # turns older than the ones shown
    lines_cut: bool  # the shown turns have older lines than the ones shown
    position: str  # the thread stream's Last-Event-ID the page starts after ("" from the start)


RUN_FIELDS = (
    "id",
    "tenant_id",
    "thread_id",
    "turn",
    "kind",
    "status",
    "outcome",
    "summary",
    "error",
    "error_kind",
    "current_step",
    "generation",
    "cost_cents",
    "children_cost_cents",
    "compensation",
    "cancel_requested_at",
    "last_event_seq",
    "created_at",
    "finished_at",
)


def read_conversation(thread: Thread) -> Conversation:
    """The thread's newest turns, their lines in order, their steps, and what waits for a person.

    Three queries (turns, lines, steps), one per kind of author for their
    names, and the pending step of a turn that waits for a person.
    """
    runs = list(Run.objects.filter(thread=thread).order_by("-turn").only(*RUN_FIELDS)[:TURNS_SHOWN])
    runs.reverse()
    ids = [run.pk for run in runs]
    found = list(
        Message.objects.filter(thread=thread)
        .filter(Q(run__isnull=True) | Q(run_id__in=ids))
        .order_by("-id")[: LINES_SHOWN + 1]
    )
    lines_cut = len(found) > LINES_SHOWN
    messages = found[:LINES_SHOWN][::-1]
    names = describe_actors(
        ((m.author_type, m.author_id) for m in messages if m.author_type != AGENT),
        tenant_id=thread.tenant_id,
    )
    steps: dict[UUID, list[Step]] = {run.pk: [] for run in runs}
    if runs:
        current = Q()
        for run in runs:
            current |= Q(run_id=run.pk, generation=run.generation)
        for step in (
            Step.objects.filter(current)
            .only("id", "run_id", "seq", "name", "kind", "status", "generation")
            # An approval's decision is all its badge reads of its output, which may be large elsewhere.
            .annotate(approved=KT("output__approved"))
            .order_by("run_id", "seq")
        ):
            if step.kind == StepKind.APPROVAL and step.approved in ("true", "false"):
                step.output = {"approved": step.approved == "true"}
            steps[step.run_id].append(step)
    turns = {
        run.pk: TurnView(
            run=run,
            steps=steps[run.pk],
            live=run.turn == thread.live_turn,
            held_behind=(
                thread.live_turn
                if thread.live_turn is not None
                and (run.turn or 0) > thread.live_turn
                and run.status == RunStatus.WAITING
                else None
            ),
        )
        for run in runs
    }
    pending: list[Line] = []
    for message in messages:
        agent = message.author_type == AGENT
        line = Line(
            message=message,
            author=(message.author_id or thread.kind) if agent else message_author(message, names),
            agent=agent,
        )
        turn = turns.get(message.run_id) if message.run_id else None
        if turn is None:
            pending.append(line)
            continue
        line.unread = not agent and message.consumed_by_step_id is None and turn.live
        turn.lines.append(line)
    for turn in turns.values():
        if turn.run.status == RunStatus.WAITING_HUMAN:
            turn.waiting = selectors.waiting_for(turn.run)
    oldest = runs[0].turn if runs else None
    return Conversation(
        turns=list(turns.values()),
        pending=pending,
        earlier_turns=(oldest - 1) if oldest else 0,
        lines_cut=lines_cut,
        position=stream_position(thread, runs),
    )


def stream_position(thread: Thread, runs: list[Run]) -> str:
    """The thread stream's event id the page already shows: the live turn's last Event, else the last turn's.

    The stream goes turn by turn, so it starts at the turn that is live: the
    turns held behind it come after it.
    """
    if thread.live_turn is not None:
        shown = next((run for run in runs if run.turn == thread.live_turn), None)
        # Not among the turns shown (more held behind it than the page shows): all its Events.
        return f"{thread.live_turn}.{shown.last_event_seq if shown is not None else 0}"
    if not runs:
        return ""
    return f"{runs[-1].turn}.{runs[-1].last_event_seq}"


def state_rows(state: Any) -> list[run_facts.InputRow]:
    """The thread's state as labelled rows (bounded like a run's input: ``run_facts.input_rows``); empty values as "—"."""
    if not state:
        return []
    return [
        row
        if row.text.strip() not in ("", "[]", "{}", "null")
        else replace(row, text="—", long=False)
        for row in run_facts.input_rows(state)
    ]


def cost_percent(thread: Thread) -> int | None:
    if not thread.cost_ceiling_cents:
        return None
    return min(100, round(100 * thread.cost_cents / thread.cost_ceiling_cents))


# The thread list


def last_activity(threads: list[Thread]) -> dict[Any, datetime]:
    """Each thread's last activity: its newest line, or its last change when that is later (one query)."""
    if not threads:
        return {}
    newest = Message.objects.filter(thread=OuterRef("pk")).order_by("-id").values("created_at")[:1]
    lines = dict(
        Thread.objects.filter(pk__in=[t.pk for t in threads])
        .annotate(last_line=Subquery(newest))
        .values_list("pk", "last_line")
    )
    return {
        t.pk: max(filter(None, (t.updated_at, lines.get(t.pk))), default=t.updated_at)
        for t in threads
    }


def thread_title(thread: Thread) -> str:
    return thread.title or thread.kind
