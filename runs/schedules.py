"""Schedules: a kind submitted on a cron expression (croniter) or every N seconds, once per fire time.

Fired by the reaper's loop (``fire_due``), however many reapers run: each
schedule is taken under its row lock (``SKIP LOCKED``: another reaper takes
the next one), and every run it submits carries the idempotency key
``schedule:<id>:<fire time>`` and commits in the same transaction as the
schedule's next fire time. So a fire time makes one run, whatever crashes
or races, and a fire time is never made twice.

``overlap`` is a concurrency key policy on the key ``schedule:<id>``
(``runs.engine.keys``): ``skip`` (``reject``: no run while the previous one
is live, the fire counts as missed), ``enqueue``, ``cancel_running``, or
``allow`` (no key). ``catch_up`` says what the first pass after downtime
does with the fire times it missed: ``one`` (a run for the latest), ``none``
(a run only for a time at most ``ON_TIME_SECONDS`` late) or ``all`` (one per
time, at most ``CATCH_UP_LIMIT``). Every fire time that made no run is
counted (``Schedule.missed``, the ``agentruns_schedule_fires_total`` metric
with its reason) and so is each fire's lateness.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from django.db import transaction

from runs.db import db_now
from runs.events import Actor
from runs.exceptions import InvalidRunInput, QueueFull, RunsError
from runs.models import CatchUp, Overlap, Schedule, Tenant

logger = logging.getLogger(__name__)

CATCH_UP_LIMIT = 100  # catch_up="all": at most this many runs for the missed times of one pass
ON_TIME_SECONDS = 60.0  # catch_up="none": a fire time later than this is missed, not run
MAX_EVERY_SECONDS = 366 * 24 * 3600

_ON_CONFLICT = {
    Overlap.SKIP: "reject",
    Overlap.ENQUEUE: "enqueue",
    Overlap.CANCEL_RUNNING: "cancel_running",
}


@dataclass(frozen=True)
class Cadence:
    cron: str
    every_seconds: int | None
    timezone: str


def check_cadence(*, cron: str | None, every_seconds: int | None, timezone: str | None) -> Cadence:
    """The cadence a schedule asks for, or InvalidRunInput saying what is wrong with it."""
    cron = (cron or "").strip()
    if bool(cron) == (every_seconds is not None):
        raise InvalidRunInput("give a schedule either cron or every_seconds")
    if every_seconds is not None and (
        isinstance(every_seconds, bool)
        or not isinstance(every_seconds, int)
        or not 1 <= every_seconds <= MAX_EVERY_SECONDS
    ):
        raise InvalidRunInput(f"every_seconds must be a whole number from 1 to {MAX_EVERY_SECONDS}")
    if cron and (len(cron) > 120 or not croniter.is_valid(cron)):
        raise InvalidRunInput(
            f"cron {cron[:120]!r} is not a cron expression (five fields: minute hour "
            "day-of-month month day-of-week, e.g. '*/5 * * * *')"
        )
    zone = timezone or "UTC"
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidRunInput(f"timezone {zone[:64]!r} is not an IANA time zone name") from None
    return Cadence(cron=cron, every_seconds=every_seconds, timezone=zone)


def next_fire_after(schedule: Schedule, after: datetime) -> datetime:
    """The schedule's first fire time strictly after ``after`` (aware, UTC)."""
    if schedule.every_seconds:
        # Fire times are anchored on the schedule's creation: created_at + k * every_seconds.
        step = schedule.every_seconds
        elapsed = (after - schedule.created_at).total_seconds()
        k = max(math.floor(elapsed / step) + 1, 1)
        return schedule.created_at + timedelta(seconds=k * step)
    zone = ZoneInfo(schedule.timezone)
    nxt = croniter(schedule.cron, after.astimezone(zone)).get_next(datetime)
    return nxt.astimezone(ZoneInfo("UTC"))


def arm(schedule: Schedule, *, now: datetime | None = None) -> None:
    """Set the next fire time of an enabled schedule (after now), or clear it for a disabled one."""
    schedule.next_fire_at = next_fire_after(schedule, now or db_now()) if schedule.enabled else None


@dataclass
class FireReport:
    fired: int = 0
    missed: int = 0


def fire_due(*, batch: int = 100) -> FireReport:
    """Fire every enabled schedule whose time has come, each in its own transaction."""
    from runs.metrics import process as metrics

    report = FireReport()
    now = db_now()
    due = list(
        Schedule.objects.filter(enabled=True, next_fire_at__lte=now)
        .order_by("next_fire_at")
        .values_list("id", flat=True)[:batch]
    )
    for schedule_id in due:
        with transaction.atomic():
            schedule = (
                Schedule.objects.select_for_update(skip_locked=True)
                .filter(pk=schedule_id, enabled=True, next_fire_at__lte=now)
                .first()
            )
            if schedule is None:
                continue  # another reaper has it, or it changed meanwhile
            outcomes = _fire(schedule, now)
        report.fired += outcomes["fired"]
        report.missed += sum(n for outcome, n in outcomes.items() if outcome != "fired")
        for outcome, n in outcomes.items():
            metrics.schedule_fired(outcome=outcome, n=n)  # committed: its transaction has ended
    return report


def _fire(schedule: Schedule, now: datetime) -> Counter[str]:
    """Fire ``schedule`` (locked) for its due times; how many fire times made a run ("fired") or
    were missed, by why ("catch_up", "overlap", "backpressure", "error")."""
    from runs.metrics import process as metrics

    times: list[datetime] = []
    at = schedule.next_fire_at
    assert at is not None
    overflow = 0
    while at <= now:
        if len(times) < CATCH_UP_LIMIT + 1:
            times.append(at)
        else:
            overflow += 1
            if overflow > 100_000:  # a years-long outage of a per-second schedule: stop counting
                break
        at = next_fire_after(schedule, at)
    if schedule.catch_up == CatchUp.ALL:
        chosen = times[:CATCH_UP_LIMIT]
    elif schedule.catch_up == CatchUp.NONE:
        chosen = [t for t in times[-1:] if (now - t).total_seconds() <= ON_TIME_SECONDS]
    else:
        chosen = times[-1:]
    outcomes: Counter[str] = Counter()
    outcomes["catch_up"] = len(times) + overflow - len(chosen)
    for fire_time in chosen:
        outcome = _submit(schedule, fire_time)
        outcomes[outcome] += 1
        if outcome == "fired":
            schedule.last_fired_at = fire_time
            late = (now - fire_time).total_seconds()
            transaction.on_commit(partial(metrics.schedule_late, late))
    outcomes = +outcomes
    schedule.fires += outcomes["fired"]
    schedule.missed += sum(n for outcome, n in outcomes.items() if outcome != "fired")
    schedule.next_fire_at = next_fire_after(schedule, now)
    schedule.updated_at = now
    schedule.save(
        update_fields=[
            "fires",
            "missed",
            "next_fire_at",
            "last_fired_at",
            "last_error",
            "updated_at",
        ]
    )
    return outcomes


def _submit(schedule: Schedule, fire_time: datetime) -> str:
    """Submit the run of one fire time: "fired", or why it made no run."""
    from runs.engine.keys import ConcurrencyKeyTaken
    from runs.services import submit

    options: dict[str, Any] = {}
    if schedule.overlap != Overlap.ALLOW:
        options = {
            "concurrency_key": f"schedule:{schedule.pk}",
            "on_conflict": _ON_CONFLICT[Overlap(schedule.overlap)],
        }
    try:
        with transaction.atomic():
            submit(
                tenant=Tenant.objects.get(pk=schedule.tenant_id),
                kind=schedule.kind,
                input=schedule.input,
                idempotency_key=f"schedule:{schedule.pk}:{fire_time.isoformat()}",
                actor=Actor(type="schedule", id=str(schedule.pk)),
                schedule=schedule,
                **options,
            )
    except ConcurrencyKeyTaken as exc:
        schedule.last_error = f"skipped {fire_time.isoformat()}: {exc}"
        return "overlap"
    except QueueFull as exc:
        schedule.last_error = f"missed {fire_time.isoformat()}: {exc}"
        return "backpressure"
    except RunsError as exc:  # the kind is gone, or the input no longer fits it
        schedule.last_error = f"missed {fire_time.isoformat()}: {exc}"
        logger.warning("schedule %s could not submit: %s", schedule.pk, exc)
        return "error"
    schedule.last_error = ""
    return "fired"
