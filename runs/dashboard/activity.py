"""A run's activity, read from its Events: who submitted, approved, cancelled... it, and what the engine did.

The run page's step timeline already shows every step, so the Events of
steps (started, done, failed, progress) are left out, and so are the
engine's housekeeping (a claim after the first, a release at shutdown, a
timer's wake-up, the queueing that follows a person's message). What stays
is what people did, with their comments, and what a person watching cares
about: the run started, waits for someone, had an attempt fail, finished.

The log reads oldest first and shows the latest ``limit`` entries, with the
number of earlier ones. It costs one query for the Events (a second when
some are left out, to count them) and one per kind of named actor
(``runs.actors``). The Event payload keys it reads are fetched alone: a
finished run's result or an approval's proposal is not loaded to say
"finished".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from runs.actors import ActorType, describe_actors, sentence_start
from runs.errors import tenant_error
from runs.models import Event, Run

DEFAULT_LIMIT = 50

# The Event types of people's actions and of the ends of a run: always shown.
ALWAYS_SHOWN = (
    "run.cancel_requested",
    "run.cancelled",
    "run.pause_requested",
    "run.paused",
    "run.resumed",
    "run.approved",
    "run.rejected",
    "run.resolved",
    "run.retried",
    "run.forked",
    "message.received",
    "run.done",
    "run.failed",
    "run.waiting",
    "approval.requested",
    "rollback.started",
    "webhook.redelivered",
)
# Why a run went back to the queue, when a person watching would want to know.
QUEUED_REASONS = ("retry", "compensation_retry", "lease_expired", "requeued", "children", "sleep")
# Why it waits for a person, besides an approval (which approval.requested tells).
WAITING_HUMAN_REASONS = ("ambiguous", "compensation")

SHOWN = (
    Q(type__in=ALWAYS_SHOWN)
    | Q(type="run.queued", seq=1)  # submitted, forked or spawned
    | Q(type="run.queued", payload__reason__in=QUEUED_REASONS)
    | Q(type="run.waiting_human", payload__reason__in=WAITING_HUMAN_REASONS)
    | Q(type="run.running", payload__attempt=1)  # started; later claims are the engine's business
)

# The payload keys the wording reads; fetched as ``payload__<key>``.
PAYLOAD_KEYS = (
    "step",
    "name",
    "comment",
    "text",
    "from_step",
    "reason",
    "error_kind",
    "error",
    "compensation",
    "compensate",
    "withdrawn",
    "action",
    "fork",
    "forked_from",
    "parent",
    "wake_at",
    "event_type",
    "seq",
)

PEOPLE = (ActorType.USER, ActorType.API_KEY)

FAILURES = {
    "retryable": "its attempts ran out on errors that usually pass",
    "fatal": "an error that retrying cannot fix",
    "ambiguous": "a side effect may or may not have happened",
    "deadline": "it ran out of running time",
    "budget": "it reached its cost ceiling",
    "step_limit": "it made more steps than its kind allows",
    "expired": "nobody acted on it in time",
    "nondeterministic": "the agent's code changed under it",
}


@dataclass(frozen=True)
class ActivityEntry:
    """One line of the log: ``who`` (blank when the run is the subject) and ``text`` make the sentence."""

    seq: int
    at: datetime
    actor: str  # the actor's name, always ("Ana Lopez", "API key ‘ci-bot’", "the worker")
    who: str  # what the sentence begins with ("Ana Lopez"), or "" when ``text`` is the whole sentence
    text: str  # "approved step 2 “pay”", or "Finished."
    comment: str = ""  # a person's own words (their comment, their message): untrusted text
    detail: str = ""  # what went wrong, as the engine recorded it: untrusted text
    tone: str = (
        ""  # "", "person", "ok", "error", "waiting": a marker's colour, always with its words
    )
    run_link: str = ""  # a run the sentence ends with, as a link: its fork, its origin, its parent

    @property
    def run_label(self) -> str:
        return f"run {self.run_link[:8]}" if self.run_link else ""

    @property
    def sentence(self) -> str:
        """The entry as plain text (a sentence with a run link leaves its ``text`` unfinished)."""
        text = f"{self.text} {self.run_label}." if self.run_link else self.text
        return f"{self.who} {text}" if self.who else text


@dataclass(frozen=True)
class Activity:
    entries: list[ActivityEntry] = field(default_factory=list)
    earlier: int = 0  # entries older than the ones shown


def activity(run: Run, *, limit: int = DEFAULT_LIMIT) -> Activity:
    """The run's latest ``limit`` activity entries, oldest first, and how many earlier ones are not shown."""
    columns = (
        "seq",
        "type",
        "actor_type",
        "actor_id",
        "created_at",
        *(f"payload__{k}" for k in PAYLOAD_KEYS),
    )
    rows = list(
        Event.objects.filter(run=run).filter(SHOWN).order_by("-seq").values(*columns)[: limit + 1]
    )
    earlier = 0
    if len(rows) > limit:
        rows = rows[:limit]
        earlier = Event.objects.filter(run=run, seq__lt=rows[-1]["seq"]).filter(SHOWN).count()
    rows.reverse()
    names = describe_actors(
        ((r["actor_type"], r["actor_id"]) for r in rows), tenant_id=run.tenant_id
    )
    entries = []
    for row in rows:
        payload = {key: row[f"payload__{key}"] for key in PAYLOAD_KEYS}
        name = names[(row["actor_type"], row["actor_id"] or "")]
        said = _Said(
            type=row["type"],
            seq=row["seq"],
            actor_type=row["actor_type"],
            name=name,
            payload=payload,
        )
        entries.append(
            ActivityEntry(
                seq=row["seq"], at=row["created_at"], actor=name, **_WORDING[row["type"]](said)
            )
        )
    return Activity(entries=entries, earlier=earlier)


def last_actor(run: Run, *event_types: str, people_only: bool = False) -> str | None:
    """The name of who made the run's latest Event of these types (not a worker's), or None: two queries at most.

    ``people_only`` also leaves out the system (the reaper, a parent run).
    """
    events = Event.objects.filter(run=run, type__in=event_types).exclude(
        actor_type=ActorType.WORKER
    )
    if people_only:
        events = events.filter(actor_type__in=PEOPLE)
    latest = events.order_by("-seq").values_list("actor_type", "actor_id").first()
    if latest is None:
        return None
    key = (latest[0], latest[1] or "")
    return describe_actors([key], tenant_id=run.tenant_id)[key]


def who_cancelled(run: Run) -> str:
    """Who cancelled the run, to begin a sentence: "Ana Lopez", "API key ‘ci-bot’", "Its parent run", "A person".

    The person who asked: a running run is cancelled by its worker at the
    step boundary, on their request.
    """
    return sentence_start(last_actor(run, "run.cancelled", "run.cancel_requested") or "a person")


# --- wording -------------------------------------------------------------------


@dataclass(frozen=True)
class _Said:
    type: str
    seq: int
    actor_type: str
    name: str
    payload: dict[str, Any]

    @property
    def by_person(self) -> bool:
        return self.actor_type in PEOPLE

    @property
    def by_worker(self) -> bool:
        return self.actor_type == ActorType.WORKER

    def step(self) -> str:
        seq, name = self.payload.get("step"), self.payload.get("name")
        if seq is None:
            return "it"
        return f"step {seq} “{name}”" if name else f"step {seq}"


def _person(said: _Said, text: str, **extra: Any) -> dict:
    return {
        "who": sentence_start(said.name),
        "text": text,
        "tone": "person" if said.by_person else "",
        **extra,
    }


def _engine(text: str, **extra: Any) -> dict:
    return {"who": "", "text": text, **extra}


# A person's comment is shown whole up to this; the approval step and the API keep all of it.
MAX_SHOWN_CHARS = 1000


def _text(value: Any) -> str:
    if not isinstance(value, str):
        return ""
    return value if len(value) <= MAX_SHOWN_CHARS else value[:MAX_SHOWN_CHARS] + "…"


def _when(value: Any) -> str:
    at = parse_datetime(value) if isinstance(value, str) else None
    if at is None:
        return "later"
    return timezone.localtime(at).strftime("%Y-%m-%d %H:%M:%S")


def _failure(said: _Said) -> str:
    kind = _text(said.payload.get("error_kind"))
    return FAILURES.get(kind, kind.replace("_", " ") or "an error")


def _queued(said: _Said) -> dict:
    payload = said.payload
    if said.seq == 1:
        if payload.get("forked_from"):
            return _person(
                said,
                f"forked it from step {payload.get('from_step')} of",
                run_link=str(payload["forked_from"]),
            )
        if payload.get("parent"):
            return _engine("Spawned as a child of", run_link=str(payload["parent"]))
        return _person(said, "submitted it.")
    reason = payload.get("reason")
    error = _text(tenant_error(payload.get("error")))
    if reason == "retry":
        return _engine("An attempt failed; it will be tried again.", detail=error, tone="error")
    if reason == "compensation_retry":
        return _engine("A compensation failed; it will be tried again.", detail=error, tone="error")
    if reason == "lease_expired":
        return _person(
            said, "put it back in the queue: its worker stopped responding.", tone="error"
        )
    if reason == "requeued":
        return _person(said, "put it back in the queue after its worker stopped responding.")
    if reason == "children":
        return _engine("Its child runs finished: it is queued again.")
    return _engine(f"Sleeping until {_when(payload.get('wake_at'))}.", tone="waiting")


def _cancelled(said: _Said) -> dict:
    compensation = said.payload.get("compensation")
    if said.by_worker:
        if compensation == "done":
            return _engine("Rolled back its finished steps and cancelled.")
        if compensation == "partial":
            return _engine("Cancelled; some of its steps were not undone.", tone="error")
        return _engine("Cancelled at the end of a step.")
    return _person(said, "cancelled it.")


def _failed(said: _Said) -> dict:
    if said.payload.get("action") == "fail":  # a person's resolution
        at = f" at {said.step()}" if said.payload.get("step") is not None else ""
        return _person(said, f"failed it{at}.", tone="error")
    detail = _text(tenant_error(said.payload.get("error")))
    if said.payload.get("compensation") == "done":
        return _engine(
            f"Rolled back its finished steps, then failed: {_failure(said)}.",
            detail=detail,
            tone="error",
        )
    if said.by_worker:
        return _engine(f"Failed: {_failure(said)}.", detail=detail, tone="error")
    return _person(said, f"stopped it: {_failure(said)}.", detail=detail, tone="error")


def _done(said: _Said) -> dict:
    if said.by_worker:
        return _engine("Finished.", tone="ok")
    return _person(said, "marked it done.", tone="ok")


def _paused(said: _Said) -> dict:
    if said.by_worker:
        return _engine("Paused at the end of a step.", tone="waiting")
    return _person(said, "paused it.")


def _resumed(said: _Said) -> dict:
    if said.payload.get("withdrawn"):
        return _person(said, "withdrew the request to pause it.")
    return _person(said, "resumed it.")


def _cancel_requested(said: _Said) -> dict:
    if said.payload.get("compensate"):
        return _person(said, "asked to cancel it and roll back its finished steps.")
    return _person(said, "asked to cancel it at the end of its current step.")


def _decided(verb: str) -> Callable[[_Said], dict]:
    def word(said: _Said) -> dict:
        return _person(said, f"{verb} {said.step()}.", comment=_text(said.payload.get("comment")))

    return word


RESOLUTIONS = {
    "done": "marked {step} as done",
    "retry": "had {step} run again",
    "skip": "skipped undoing {step}",
}


def _resolved(said: _Said) -> dict:
    template = RESOLUTIONS.get(said.payload.get("action", ""), "resolved {step}")
    return _person(said, template.format(step=said.step()) + ".")


def _retried(said: _Said) -> dict:
    from_step = said.payload.get("from_step")
    return _person(said, f"retried it from step {from_step}." if from_step else "retried it.")


def _forked(said: _Said) -> dict:
    fork = str(said.payload.get("fork") or "")
    return _person(said, f"forked it from step {said.payload.get('from_step')} into", run_link=fork)


def _waiting(said: _Said) -> dict:
    if said.payload.get("reason") == "children":
        return _engine("Waiting for its child runs.", tone="waiting")
    return _engine("Waiting for a message.", tone="waiting")


def _waiting_human(said: _Said) -> dict:
    detail = _text(tenant_error(said.payload.get("error")))
    if said.payload.get("reason") == "compensation":
        return _engine(
            "Waiting for a person: a step could not be undone during the rollback.",
            detail=detail,
            tone="waiting",
        )
    return _engine(
        "Waiting for a person: a side effect may or may not have happened.",
        detail=detail,
        tone="waiting",
    )


def _approval_requested(said: _Said) -> dict:
    seq, name = said.payload.get("seq"), said.payload.get("name")
    return _engine(
        f"Waiting for a person to approve step {seq} “{name}”."
        if name
        else f"Waiting for a person to approve step {seq}.",
        tone="waiting",
    )


_WORDING: dict[str, Callable[[_Said], dict]] = {
    "run.queued": _queued,
    "run.running": lambda said: _engine("Started."),
    "run.cancel_requested": _cancel_requested,
    "run.cancelled": _cancelled,
    "run.pause_requested": lambda said: _person(
        said, "asked to pause it at the end of its current step."
    ),
    "run.paused": _paused,
    "run.resumed": _resumed,
    "run.approved": _decided("approved"),
    "run.rejected": _decided("rejected"),
    "run.resolved": _resolved,
    "run.retried": _retried,
    "run.forked": _forked,
    "message.received": lambda said: _person(
        said, "sent a message.", comment=_text(said.payload.get("text"))
    ),
    "run.done": _done,
    "run.failed": _failed,
    "run.waiting": _waiting,
    "run.waiting_human": _waiting_human,
    "approval.requested": _approval_requested,
    "rollback.started": lambda said: _engine("Began rolling back its finished steps."),
    "webhook.redelivered": lambda said: _person(
        said, f"sent the {_text(said.payload.get('event_type')) or 'webhook'} webhook again."
    ),
}
