"""The states of a run and of a step (drawn in docs/architecture.md), importable before Django's apps are ready."""

from __future__ import annotations

from django.db import models


class RunStatus(models.TextChoices):
    QUEUED = "queued"  # waiting for a worker (possibly until run_after)
    RUNNING = "running"  # held by a worker under a lease
    WAITING_HUMAN = "waiting_human"  # an approval or an ambiguous side effect needs a person
    WAITING = "waiting"  # waiting for child runs or a message
    PAUSED = "paused"  # paused by a person
    DONE = "done"  # finished with a result
    FAILED = "failed"  # finished without one; error_kind says why
    CANCELLED = "cancelled"  # stopped by a person


TERMINAL_STATUSES = frozenset({RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED})

# The Events that end a run (an event stream closes after one) and those a
# webhook tells about (docs/how-to/webhooks.md): a run ended, or waits for a person.
TERMINAL_EVENT_TYPES = frozenset(f"run.{status.value}" for status in TERMINAL_STATUSES)
WEBHOOK_EVENT_TYPES = (
    "run.done",
    "run.failed",
    "run.cancelled",
    "run.waiting_human",
    # A thread's turn ended and it listens again (with the turn's reply), or it was closed.
    "thread.asleep",
    "thread.closed",
)


# A run that is live for the purpose of its parent and children: not terminal.
LIVE_STATUSES = frozenset(RunStatus) - TERMINAL_STATUSES


class Compensation(models.TextChoices):
    """Where a run's rollback (saga) stands; blank when it never began one."""

    NONE = "", "none"  # no rollback
    REQUESTED = (
        "requested"  # cancelled with compensate: the next worker to claim it begins the rollback
    )
    RUNNING = "running"  # compensations are running (or queued to run) in reverse order
    DONE = "done"  # every completed step with a compensation was undone
    PARTIAL = "partial"  # ended with some steps not undone (a person skipped them, or cancelled)


class ErrorKind(models.TextChoices):
    RETRYABLE = "retryable"  # retry budget spent on transient errors
    FATAL = "fatal"  # an error that retrying cannot fix
    AMBIGUOUS = "ambiguous"  # a side effect may or may not have happened
    DEADLINE = "deadline"  # running time beyond deadline_seconds
    BUDGET = "budget"  # cost beyond the ceiling
    STEP_LIMIT = "step_limit"  # too many steps or model iterations
    EXPIRED = "expired"  # waited for people beyond expires_at
    NONDETERMINISTIC = "nondeterministic"  # replay met a different step than recorded


class RunOutcome(models.TextChoices):
    """What a finished run says it achieved, told by its agent with ``ctx.report()``; blank when it said nothing.

    It qualifies the status, never replaces it: a run whose update a person
    rejected is ``done`` (it did its job) with the outcome ``unchanged``.
    """

    NONE = "", "Not reported"  # the agent did not say
    SUCCEEDED = "succeeded", "Succeeded"  # it did what it was asked
    UNCHANGED = (
        "unchanged",
        "Nothing changed",
    )  # it finished without changing anything (rejected, nothing to do)
    PARTIAL = "partial", "Partly done"  # some of the work was done, some not


class StepStatus(models.TextChoices):
    RUNNING = "running"  # executing, or written ahead of a side effect
    DONE = "done"  # output recorded; replay returns it
    FAILED = "failed"  # the last execution failed (attempts keep every try)
    WAITING = "waiting"  # waiting for a person or a message
    COMPENSATED = "compensated"  # undone by its compensation


class StepKind(models.TextChoices):
    LLM = "llm"  # a model call
    TOOL = "tool"  # a tool call
    APPROVAL = "approval"  # a person's decision
    MESSAGE = "message"  # messages consumed
    CHILD = "child"  # child runs spawned
    SLEEP = "sleep"  # a durable timer
    COMPENSATION = "compensation"  # a saga compensation
    STATE = "state"  # a thread's state patched, or the thread closed, when the turn ends well
    REPLY = "reply"  # a turn's answer in its conversation
    CUSTOM = "custom"  # any other function


class ThreadStatus(models.TextChoices):
    ASLEEP = "asleep"  # between turns: it listens to its conversation, and only a mention wakes it
    ACTIVE = "active"  # a turn is live (queued, running, waiting, paused...)
    CLOSED = "closed"  # the agent or a person ended it: no more turns


class ThreadPolicy(models.TextChoices):
    """What a message posted to a thread does while one of its turns is live (double-texting)."""

    INTERLEAVE = "interleave"  # it enters the live turn, read at its next message step
    ENQUEUE = "enqueue"  # a new turn runs after the live one ends
    INTERRUPT = "interrupt"  # the live turn is cancelled at its next step; a new turn follows
    ROLLBACK = "rollback"  # the live turn is cancelled with compensation; a new turn follows
    REJECT = "reject"  # refused (409, naming the live turn)


class Delivered(models.TextChoices):
    """What became of a message posted to a thread (the answer of POST /api/threads/{id}/messages)."""

    LIVE_TURN = "live_turn"  # read by the turn that is live
    NEW_TURN = "new_turn"  # a new turn was queued with it
    QUEUED_TURN = "queued_turn"  # a new turn, held until the turns before it end
    RECORDED = "recorded"  # kept for the next turn; nothing woke
