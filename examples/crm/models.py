"""A tiny local CRM: the table the example ``crm_update`` agent reads and writes, one set of leads per tenant."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class Stage(models.TextChoices):
    NEW = "new"  # not contacted yet
    CONTACTED = "contacted"  # a first conversation happened
    QUALIFIED = "qualified"  # has budget, need and a decision maker
    PROPOSAL = "proposal"  # an offer was sent
    WON = "won"  # signed
    LOST = "lost"  # decided against us


class Lead(models.Model):
    # Whose lead it is: a run reads and writes only its own tenant's leads (examples.crm.services).
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE, related_name="+")
    name = models.CharField(max_length=200)
    company = models.CharField(max_length=200, blank=True, default="")
    email = models.EmailField()
    stage = models.CharField(max_length=16, choices=Stage.choices, default=Stage.NEW)
    notes = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(stage__in=Stage.values), name="lead_stage_valid"),
            models.UniqueConstraint(fields=["tenant", "email"], name="lead_unique_tenant_email"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.company or self.email})"

    def as_dict(self) -> dict:
        return {
            "id": self.pk,
            "name": self.name,
            "company": self.company,
            "email": self.email,
            "stage": self.stage,
            "notes": self.notes,
            "updated_at": self.updated_at.isoformat(),
        }


class LeadUpdate(models.Model):
    """One applied change, keyed by the idempotency key of the write: a repeated write finds it and does nothing."""

    idempotency_key = models.CharField(max_length=255, unique=True)
    lead = models.ForeignKey(Lead, on_delete=models.CASCADE, related_name="updates")
    changes = models.JSONField()
    previous = models.JSONField()
    run_id = models.UUIDField(null=True, blank=True)
    applied_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.lead_id}: {self.changes}"

    def as_dict(self) -> dict:
        return {
            "update_id": self.pk,
            "lead_id": self.lead_id,
            "changes": self.changes,
            "previous": self.previous,
            "applied_at": self.applied_at.isoformat(),
        }
