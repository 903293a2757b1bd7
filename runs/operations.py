"""Operator levers (docs/how-to/operations.md): pause and resume queues, tenants and kinds; requeue a stuck run.

Pausing stops workers claiming from a queue, for a tenant, or of a kind;
runs already running finish. Each lever is recorded in the log with the
operator; run-level actions are Events through runs.control.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from runs.db import notify_queues
from runs.engine import reaping
from runs.events import Actor
from runs.exceptions import InvalidTransition
from runs.models import KindState, Pausable, Queue, Run, Tenant
from runs.registry import get_kind

logger = logging.getLogger(__name__)


def _set_paused[P: Pausable](
    model: type[P], *, name: str, paused: bool, actor: Actor, wakes: str | None
) -> P:
    """Pause or resume one queue or kind; on resume wake the workers of queue ``wakes``."""
    state, _ = model._default_manager.update_or_create(
        name=name, defaults={"paused": paused, "paused_at": timezone.now() if paused else None}
    )
    logger.info(
        "%s %s %s by %s:%s",
        model._meta.verbose_name,
        name,
        "paused" if paused else "resumed",
        actor.type,
        actor.id,
    )
    if not paused and wakes is not None:
        transaction.on_commit(lambda: notify_queues([wakes]))
    return state


def set_queue_paused(*, name: str, paused: bool, actor: Actor) -> Queue:
    return _set_paused(Queue, name=name, paused=paused, actor=actor, wakes=name)


def set_kind_paused(*, name: str, paused: bool, actor: Actor) -> KindState:
    kind = get_kind(name)
    return _set_paused(
        KindState, name=name, paused=paused, actor=actor, wakes=kind.queue if kind else None
    )


def set_tenant_paused(*, tenant: Tenant, paused: bool, actor: Actor) -> Tenant:
    Tenant.objects.filter(pk=tenant.pk).update(paused=paused)
    tenant.paused = paused
    logger.info(
        "tenant %s %s by %s:%s",
        tenant.slug,
        "paused" if paused else "resumed",
        actor.type,
        actor.id,
    )
    if not paused:
        queues = set(
            Run.objects.for_tenant(tenant).queued().values_list("queue", flat=True).distinct()[:100]
        )
        if queues:
            transaction.on_commit(lambda: notify_queues(queues))
    return tenant


def requeue_stuck_run(*, run: Run, actor: Actor) -> Run:
    """Return a running run whose lease expired to the queue now, as the reaper would (fenced on its token)."""
    run = Run.objects.get(pk=run.pk)
    if run.lease_token is None or not Run.objects.stale().filter(pk=run.pk).exists():
        raise InvalidTransition("only a running run whose lease has expired can be requeued")
    status = reaping.rescue(
        reaping.StaleLease(run_id=run.pk, token=run.lease_token, queue=run.queue),
        reason="requeued",
        actor_type=actor.type,
        actor_id=actor.id,
        error="requeued by an operator after its worker stopped heartbeating",
    )
    if status is None:
        raise InvalidTransition("the run changed meanwhile (it finished, or its worker came back)")
    return Run.objects.get(pk=run.pk)
