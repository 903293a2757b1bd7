"""Reads of the dashboard that the API does not need: id search, approvals count, timeline, webhook deliveries.

The run list itself is ``runs.selectors.list_runs``, the API's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from uuid import UUID

from runs.models import Artifact, Message, Run, RunStatus, Step, Tenant, WebhookDelivery

ID_PREFIX = re.compile(r"^[0-9a-f]{1,32}$")


def id_range(search: str) -> tuple[UUID, UUID] | None:
    """The UUIDs starting with ``search`` (hex digits, dashes ignored) as an inclusive range; None if not hex.

    A range on the primary key, not ``id::text LIKE``, so the index can answer it.
    """
    digits = search.strip().lower().replace("-", "")
    if not ID_PREFIX.match(digits):
        return None
    return UUID(digits.ljust(32, "0")), UUID(digits.ljust(32, "f"))


def count_waiting_for_people(*, tenant: Tenant) -> int:
    """Runs waiting for an approver: a pending approval or an ambiguous side effect to resolve."""
    return Run.objects.for_tenant(tenant).filter(status=RunStatus.WAITING_HUMAN).count()


@dataclass
class TimelineStep:
    step: Step
    artifacts: list[Artifact] = field(default_factory=list)


def timeline(*, run: Run) -> list[TimelineStep]:
    """The steps of the run's current generation with their artifacts (two queries)."""
    steps = list(Step.objects.filter(run=run, generation=run.generation).order_by("seq"))
    by_step: dict[int, list[Artifact]] = defaultdict(list)
    if steps:
        for artifact in Artifact.objects.filter(run=run, step__in=[s.pk for s in steps]).order_by("id"):
            by_step[artifact.step_id].append(artifact)
    return [TimelineStep(step=s, artifacts=by_step[s.pk]) for s in steps]


def recent_messages(*, run: Run, limit: int = 20) -> list[Message]:
    """The run's latest messages, oldest first."""
    latest = list(Message.objects.filter(run=run).order_by("-id")[:limit])
    return latest[::-1]


def get_artifact(*, run: Run, artifact_id: int) -> Artifact | None:
    return Artifact.objects.filter(run=run, pk=artifact_id).first()


# What the run page shows of a delivery; the receiver's answer body stays in the admin.
DELIVERY_FIELDS = (
    "id", "run_id", "url", "event_type", "status", "attempts", "response_code", "last_error",
    "next_attempt_at", "last_attempt_at", "delivered_at", "created_at",
)


def recent_deliveries(*, run: Run, limit: int = 20) -> list[WebhookDelivery]:
    """The run's latest webhook deliveries, newest first (one query, on the (run, id) index)."""
    return list(WebhookDelivery.objects.filter(run=run).only(*DELIVERY_FIELDS).order_by("-id")[:limit])


def get_delivery(*, run: Run, delivery_id: int) -> WebhookDelivery | None:
    return WebhookDelivery.objects.filter(run=run, pk=delivery_id).first()
