"""Reads and writes of the CRM table, always within one tenant's leads."""

from __future__ import annotations

from uuid import UUID

from django.db import transaction
from django.utils import timezone

from examples.crm.models import Lead, LeadUpdate


class LeadNotFound(Exception):
    pass


def get_lead(*, tenant_id: UUID, lead_id: int) -> Lead:
    """The tenant's lead ``lead_id``; another tenant's lead is not found, as one that does not exist."""
    lead = Lead.objects.filter(tenant_id=tenant_id, pk=lead_id).first()
    if lead is None:
        raise LeadNotFound(f"there is no lead {lead_id}")
    return lead


@transaction.atomic
def apply_lead_update(
    *,
    tenant_id: UUID,
    lead_id: int,
    idempotency_key: str,
    stage: str | None = None,
    note: str = "",
    run_id: UUID | None = None,
) -> LeadUpdate:
    """Apply a stage change and/or a note to one of the tenant's leads, once per ``idempotency_key``.

    A second call with the same key returns the first call's update and
    changes nothing, so a write repeated after a crash is harmless.
    """
    lead = Lead.objects.select_for_update().filter(tenant_id=tenant_id, pk=lead_id).first()
    if lead is None:
        raise LeadNotFound(f"there is no lead {lead_id}")
    # The lead's row lock serialises writers of one lead, so the lookup and the insert cannot race.
    existing = LeadUpdate.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing
    now = timezone.now()
    changes: dict = {}
    previous: dict = {}
    if stage and stage != lead.stage:
        previous["stage"], changes["stage"] = lead.stage, stage
        lead.stage = stage
    if note:
        previous["notes"] = lead.notes
        changes["note"] = note
        lead.notes = f"{lead.notes}\n{now:%Y-%m-%d}: {note}".strip()
    lead.updated_at = now
    lead.save(update_fields=["stage", "notes", "updated_at"])
    return LeadUpdate.objects.create(
        idempotency_key=idempotency_key,
        lead=lead,
        changes=changes,
        previous=previous,
        run_id=run_id,
        applied_at=now,
    )
