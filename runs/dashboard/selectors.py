"""Reads of the dashboard that the API does not need: id search, approvals count, timeline, webhook deliveries.

The run list itself is ``runs.selectors.list_runs``, the API's.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from uuid import UUID

from django.db.models import Exists, OuterRef, Q

from runs import payloads
from runs.models import (
    Artifact,
    Message,
    ReceiverOf,
    Run,
    RunStatus,
    Step,
    Tenant,
    WebhookDelivery,
    WebhookReceiver,
)

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
    # A step output stored as an artifact (runs.payloads) names it in its reference.
    referenced = {
        s.output[payloads.REFERENCE]: s.pk for s in steps if payloads.is_reference(s.output)
    }
    if steps:
        for artifact in Artifact.objects.filter(
            Q(step__in=[s.pk for s in steps]) | Q(pk__in=list(referenced)), run=run
        ).order_by("id"):
            by_step[artifact.step_id or referenced[artifact.pk]].append(artifact)
    return [TimelineStep(step=s, artifacts=by_step[s.pk]) for s in steps]


def last_step(*, run: Run) -> Step | None:
    """The newest step row of the run's current generation (one query on the (run, generation, seq) key)."""
    return (
        Step.objects.filter(run=run, generation=run.generation)
        .only("id", "seq", "name", "status", "kind")
        .order_by("-seq")
        .first()
    )


def recent_messages(*, run: Run, limit: int = 20) -> list[Message]:
    """The run's latest messages, oldest first."""
    latest = list(Message.objects.filter(run=run).order_by("-id")[:limit])
    return latest[::-1]


def get_artifact(*, run: Run, artifact_id: int) -> Artifact | None:
    return Artifact.objects.filter(run=run, pk=artifact_id).first()


# What the run page shows of a delivery; the receiver's answer body and the
# sender's own error sentence (addresses, ports, TLS details) stay in the admin.
DELIVERY_FIELDS = (
    "id",
    "run_id",
    "url",
    "event_type",
    "status",
    "attempts",
    "response_code",
    "failure",
    "next_attempt_at",
    "last_attempt_at",
    "delivered_at",
    "created_at",
)


def recent_deliveries(*, run: Run, limit: int = 20) -> list[WebhookDelivery]:
    """The run's latest webhook deliveries, newest first, each with ``receiver_paused`` (one query)."""
    paused = WebhookReceiver.objects.filter(
        tenant_id=run.tenant_id, receiver=ReceiverOf(OuterRef("url")), paused_at__isnull=False
    )
    return list(
        WebhookDelivery.objects.filter(run=run)
        .only(*DELIVERY_FIELDS)
        .annotate(receiver_paused=Exists(paused))
        .order_by("-id")[:limit]
    )


def get_delivery(*, run: Run, delivery_id: int) -> WebhookDelivery | None:
    return WebhookDelivery.objects.filter(run=run, pk=delivery_id).first()


@dataclass
class Family:
    """Where a run sits in a tree of runs: its parent, the run it was forked from, its children."""

    parent: Run | None = None
    origin: Run | None = None
    children: list[Run] = field(default_factory=list)
    more_children: int = 0  # beyond the ones listed

    @property
    def counts(self) -> dict[str, int]:
        found: dict[str, int] = defaultdict(int)
        for child in self.children:
            found[child.status] += 1
        return dict(found)

    def __bool__(self) -> bool:
        return bool(self.parent or self.origin or self.children)


CHILDREN_SHOWN = 100


def family(*, run: Run, children: bool = True) -> Family:
    """The run's parent and origin (one query, only if it has either) and its first children, in spawn order.

    ``children=False`` skips the children's query (a run that never spawned).
    """
    related: dict[UUID | None, Run] = {
        r.pk: r
        for r in Run.objects.filter(pk__in=[k for k in (run.parent_id, run.origin_id) if k]).only(
            "id", "kind", "status", "title", "tenant_id"
        )
    }
    if not children:
        return Family(parent=related.get(run.parent_id), origin=related.get(run.origin_id))
    shown = list(
        Run.objects.filter(parent=run)
        .order_by("created_at", "id")
        .only(
            "id",
            "kind",
            "status",
            "title",
            "outcome",
            "summary",
            "cost_cents",
            "created_at",
            "finished_at",
            "compensation",
        )[: CHILDREN_SHOWN + 1]
    )
    more = 0
    if len(shown) > CHILDREN_SHOWN:
        more = Run.objects.filter(parent=run).count() - CHILDREN_SHOWN
        shown = shown[:CHILDREN_SHOWN]
    return Family(
        parent=related.get(run.parent_id),
        origin=related.get(run.origin_id),
        children=shown,
        more_children=more,
    )
