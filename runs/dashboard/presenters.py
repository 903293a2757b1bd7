"""How the dashboard words a run: labels, advice, the buttons its state allows, what a poll must refresh,
its webhook deliveries.

Plain functions of a run, so templates only print and tests can call them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any
from urllib.parse import urlsplit

from django.utils import timezone

from runs.dashboard.access import Access, Action
from runs.models import (
    WEBHOOK_EVENT_TYPES,
    DeliveryFailure,
    DeliveryStatus,
    Run,
    RunStatus,
    WebhookDelivery,
)
from runs.registry import get_kind

CENT = Decimal("0.01")

# Large step payloads are cut for display; the API serves them whole.
MAX_JSON_CHARS = 20_000

STATUS_LABELS: dict[str, str] = {
    RunStatus.QUEUED: "Queued",
    RunStatus.RUNNING: "Running",
    RunStatus.WAITING_HUMAN: "Needs a person",
    RunStatus.WAITING: "Waiting",
    RunStatus.PAUSED: "Paused",
    RunStatus.DONE: "Done",
    RunStatus.FAILED: "Failed",
    RunStatus.CANCELLED: "Cancelled",
}


def status_label(status: str) -> str:
    return STATUS_LABELS.get(status, status.replace("_", " ").capitalize())


# What the agent said about a finished run: the engine's "done" only means its code returned.
OUTCOME_LABELS = {
    "succeeded": "Done",
    "unchanged": "Nothing changed",
    "partial": "Partly done",
}


@dataclass(frozen=True)
class Headline:
    css: str  # the badge-<css> class
    label: str


def headline(run: Run) -> Headline:
    """The run's first word: its outcome when it is done and the agent said one, else its status."""
    outcome = getattr(run, "outcome", "")
    if run.status == RunStatus.DONE and outcome in OUTCOME_LABELS:
        return Headline("done" if outcome == "succeeded" else outcome, OUTCOME_LABELS[outcome])
    return Headline(run.status, status_label(run.status))


def pretty_json(value: Any, limit: int = MAX_JSON_CHARS) -> str:
    """Model and tool output as indented JSON text; the template escapes it like any other string."""
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    if len(text) > limit:
        return f"{text[:limit]}\n… ({len(text) - limit:,} more characters; GET /api/runs/<id>/steps has all of it)"
    return text


def money(cents: Decimal | float | int | None) -> str:
    """Cents as people read them: "0¢", "0.0042¢", "2.35¢", "$12.40".

    A model call can cost a ten-thousandth of a cent: amounts under a cent
    keep two significant digits instead of rounding to nothing.
    """
    if cents is None:
        return "—"
    cents = Decimal(str(cents))
    if cents == 0:
        return "0¢"
    if cents < 1:
        step = Decimal(1).scaleb(cents.adjusted() - 1)  # two significant digits
        return f"{_plain(cents.quantize(step, ROUND_HALF_UP))}¢"
    if cents < 100:
        return f"{_plain(cents.quantize(CENT, ROUND_HALF_UP))}¢"
    return f"${(cents / 100).quantize(CENT, ROUND_HALF_UP):,}"


def _plain(value: Decimal) -> str:
    """A decimal without an exponent or trailing zeros after the point: "0.0042", "2.3", "12"."""
    text = f"{value:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(seconds: float | None) -> str:
    """ "0.4 s", "12 s", "3 min 05 s", "2 h 03 min"."""
    if seconds is None:
        return "—"
    if seconds < 10:
        return f"{seconds:.1f} s"
    total = int(seconds)
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    """ "12 s ago", "5 min ago", "3 h ago", "4 days ago"."""
    if moment is None:
        return "—"
    seconds = max(0, int(((now or timezone.now()) - moment).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    days = seconds // 86400
    return f"{days} day{'s' if days != 1 else ''} ago"


def until(moment: datetime | None, now: datetime | None = None) -> str:
    """ "now", "in 12 s", "in 5 min", "in 3 h": the other way from ``ago``."""
    if moment is None:
        return "—"
    seconds = int((moment - (now or timezone.now())).total_seconds())
    if seconds <= 0:
        return "now"
    if seconds < 60:
        return f"in {seconds} s"
    if seconds < 3600:
        return f"in {seconds // 60} min"
    return f"in {seconds // 3600} h"


def elapsed_seconds(run: Run, now: datetime | None = None) -> float | None:
    """Wall time since the run first started, until it finished (or now)."""
    if run.started_at is None:
        return None
    end = run.finished_at or now or timezone.now()
    return max(0.0, (end - run.started_at).total_seconds())


def progress_percent(run: Run) -> int | None:
    if not run.steps_total:
        return None
    return min(100, round(100 * run.steps_done / run.steps_total))


def cost_percent(run: Run) -> int | None:
    if not run.cost_ceiling_cents:
        return None
    return min(
        100, round(100 * (run.cost_cents + run.children_cost_cents) / run.cost_ceiling_cents)
    )


ADVICE = {
    "retryable": "It kept failing on errors that usually pass (timeouts, rate limits, 5xx answers) until its "
    "attempts ran out. Check that the service it calls is back, then retry it.",
    "fatal": "Retrying the same input will fail the same way. Fix the input or the system it talks to, then "
    "retry it or submit a new run.",
    "ambiguous": "A side effect may or may not have happened, and a person decided to fail the run. Check "
    "the other system before retrying, or the effect may happen twice.",
    "deadline": "It ran out of running time. Retry with a larger deadline (the finished steps are kept).",
    "budget": "It reached its cost ceiling. Retry with a larger ceiling (the finished steps are kept).",
    "step_limit": "It made more steps or model calls than its kind allows. Retry from an earlier step, or ask "
    "the agent's author to raise the limit.",
    "expired": "It waited for a person longer than allowed. Retry it to queue it again.",
    "nondeterministic": "The agent's code changed under a run in progress: replay met a different step than "
    "the one recorded. Retry from the step that changed.",
}


def advice(run: Run, *, cancelled_by: str = "") -> str:
    """What to do about a run that stopped, in one or two sentences."""
    if run.compensation == "done" and run.is_terminal:
        return "Rolled back: every finished step with a compensation was undone. Retry it to start again."
    if run.compensation == "partial" and run.is_terminal:
        return "Partly rolled back: the steps named above were not undone; check them in the other systems."
    if run.status == RunStatus.CANCELLED:
        return f"{cancelled_by or 'A person'} cancelled it. Retry it to start again; its finished steps are kept."
    if run.status == RunStatus.FAILED:
        return ADVICE.get(run.error_kind, "Read the error, fix its cause, then retry it.")
    if run.status == RunStatus.QUEUED and run.error:
        return "The last attempt failed; it will be retried automatically."
    return ""


# What the confirmation of each destructive action says (the run page's dialog shows the same words).
CONFIRM_CANCEL = "The run stops for good: a running step is let finish, nothing after it runs. You can retry it later."
CONFIRM_ROLL_BACK = (
    "Every finished step with a compensation is undone, newest first, then the run is cancelled. "
    "This changes the other systems the run touched."
)
CONFIRM_REJECT = (
    "The agent goes on without doing what it proposed. A rejection cannot be taken back."
)


@dataclass(frozen=True)
class Controls:
    """The buttons a run's state allows, already filtered by the user's role."""

    cancel: bool
    pause: bool
    resume: bool
    retry: bool
    message: bool
    decide: bool  # approve / reject a pending approval
    resolve: bool  # decide an ambiguous side effect, or a compensation that failed
    cancel_requested: bool
    pause_requested: bool
    roll_back: bool = False  # cancel with compensate: the kind is a saga and steps are done

    @property
    def any_button(self) -> bool:
        """Any of the buttons of the action bar (Retry has a form of its own)."""
        return self.cancel or self.pause or self.resume


def controls(run: Run, access: Access, waiting: dict | None) -> Controls:
    live = not run.is_terminal
    running = run.status == RunStatus.RUNNING
    kind = (waiting or {}).get("type")
    return Controls(
        cancel=access.can(Action.CANCEL) and live and run.cancel_requested_at is None,
        pause=access.can(Action.PAUSE)
        and (run.status == RunStatus.QUEUED or (running and run.pause_requested_at is None)),
        resume=access.can(Action.RESUME)
        and (run.status == RunStatus.PAUSED or (running and run.pause_requested_at is not None)),
        retry=access.can(Action.RETRY) and run.status in (RunStatus.FAILED, RunStatus.CANCELLED),
        message=access.can(Action.MESSAGE) and live,
        decide=access.can(Action.APPROVE) and kind == "approval",
        resolve=access.can(Action.RESOLVE) and kind in ("ambiguous", "compensation"),
        # A request waits for a running run's step to end; any other state acted on it at once.
        cancel_requested=running and run.cancel_requested_at is not None,
        pause_requested=running and run.pause_requested_at is not None,
        roll_back=(
            access.can(Action.CANCEL)
            and live
            and run.cancel_requested_at is None
            and not run.compensation
            and run.steps_done > 0
            and _is_saga(run.kind)
        ),
    )


def _is_saga(kind_name: str) -> bool:
    kind = get_kind(kind_name)
    return kind is not None and bool(kind.compensate_on)


def needs_new_bound(run: Run) -> str:
    """Which bound a retry must raise ("deadline", "budget") for a run that failed on one, else ""."""
    if run.status == RunStatus.FAILED and run.error_kind in ("deadline", "budget"):
        return run.error_kind
    return ""


# What a poll of the run page must refresh. The poll URL carries the
# versions the page shows; the answer re-renders the controls and the step
# timeline only when theirs changed, so a comment being typed or an opened
# <details> survives the polls in between.
def controls_version(run: Run) -> str:
    version = f"{run.status}.{int(run.cancel_requested_at is not None)}.{int(run.pause_requested_at is not None)}"
    if run.status == RunStatus.WAITING_HUMAN:
        version += f".{run.last_event_seq}"  # a second approval in a row is a new card
    return version


def timeline_version(run: Run) -> str:
    # Every finished step writes an event; a step that starts changes current_step.
    raw = f"{run.generation}.{run.last_event_seq}.{run.status}.{run.current_step}"
    return hashlib.blake2s(raw.encode(), digest_size=6).hexdigest()


# Webhook deliveries. Only an Event a webhook tells about writes delivery
# rows, and the run is then in that Event's state: a poll that finds the
# run in another state has no new delivery to show.
NOTIFIED_STATUSES = frozenset(event_type.removeprefix("run.") for event_type in WEBHOOK_EVENT_TYPES)


def deliveries_may_have_changed(run: Run) -> bool:
    return run.status in NOTIFIED_STATUSES


@dataclass(frozen=True)
class DeliveryRow:
    delivery: WebhookDelivery
    target: str  # where it goes, without credentials or query string
    when: str  # what happened last, or what happens next
    redeliver: bool  # the button: finished (delivered or dead), and the user may retry runs
    problem: str = (
        ""  # why the last attempt failed, in the tenant's words (the whole error is in the admin)
    )


def delivery_rows(deliveries: list[WebhookDelivery], access: Access) -> list[DeliveryRow]:
    may_retry = access.can(Action.RETRY)
    return [
        DeliveryRow(
            delivery=d,
            target=delivery_target(d.url),
            when=_delivery_when(d),
            redeliver=may_retry and not d.is_live,
            problem=delivery_problem(d),
        )
        for d in deliveries
    ]


def delivery_problem(delivery: WebhookDelivery) -> str:
    """What a tenant is told of a failed attempt: its kind, never the sender's own error sentence.

    The sentence says which address a name resolved to, and how a port
    answered; shown to whoever chose the URL, it makes webhooks a scanner.
    """
    if delivery.status == DeliveryStatus.DELIVERED or not delivery.attempts:
        return ""
    code = delivery.response_code
    if code is not None:
        return f"the receiver answered {code}" + (
            "; redirects are not followed" if 300 <= code < 400 else ""
        )
    if delivery.failure in DeliveryFailure.values and delivery.failure:
        return DeliveryFailure(delivery.failure).label
    return "the delivery failed" if delivery.status != DeliveryStatus.SENDING else ""


def delivery_target(url: str) -> str:
    """A webhook URL as the run page shows it: a receiver's token often rides in the query string."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:  # a port that is not a number: stored before the checks, or by hand
        parts, port = None, ""
    if parts is None or not parts.hostname:
        return url.partition("?")[0][:200]
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}" + ("?…" if parts.query else "")


def _delivery_when(delivery: WebhookDelivery) -> str:
    if delivery.status == DeliveryStatus.DELIVERED:
        return f"delivered {ago(delivery.delivered_at)}"
    if delivery.status == DeliveryStatus.DEAD:
        return f"gave up {ago(delivery.last_attempt_at or delivery.created_at)}"
    if delivery.status == DeliveryStatus.SENDING:
        return "being sent"
    if getattr(delivery, "receiver_paused", False):
        return "paused: the receiver kept not answering; an operator resumes it"
    return f"next attempt {until(delivery.next_attempt_at)}"
