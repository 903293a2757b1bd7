"""A small table of pretend infrastructure, per tenant: what the example ``deploy_app`` saga creates and undoes."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.utils import timezone


class ResourceKind(models.TextChoices):
    DNS = "dns"  # a DNS record
    CERTIFICATE = "certificate"  # a TLS certificate for the record
    CONTAINER = "container"  # the running application
    MONITOR = "monitor"  # an uptime check


class ResourceState(models.TextChoices):
    ACTIVE = "active"  # exists
    DELETED = "deleted"  # removed (by a compensation, or by hand)


class Resource(models.Model):
    # Whose deploy made it: the saga creates and undoes only its run's tenant's resources.
    tenant = models.ForeignKey("runs.Tenant", on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=16, choices=ResourceKind.choices)
    name = models.CharField(max_length=200)
    state = models.CharField(
        max_length=16, choices=ResourceState.choices, default=ResourceState.ACTIVE
    )
    # The step's idempotency key: creating or deleting twice with it changes nothing.
    key = models.CharField(max_length=255, unique=True)
    run_id = models.UUIDField()
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=ResourceKind.values), name="resource_kind_valid"
            ),
            models.CheckConstraint(
                condition=Q(state__in=ResourceState.values), name="resource_state_valid"
            ),
        ]
        indexes = [models.Index(fields=["run_id"], name="resource_run_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} ({self.state})"
