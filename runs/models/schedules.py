"""Schedules: a kind submitted on a cron expression or every N seconds (runs.schedules fires them)."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone as django_timezone

from runs.models.tenancy import Tenant


class Overlap(models.TextChoices):
    """What a fire does while the schedule's previous run is live (a concurrency key policy)."""

    SKIP = "skip"  # no run: the fire is counted as missed
    ENQUEUE = "enqueue"  # the run waits for the previous one to end
    CANCEL_RUNNING = "cancel_running"  # the previous run is cancelled at its next step boundary
    ALLOW = "allow"  # runs may overlap


class CatchUp(models.TextChoices):
    """What the first pass after downtime does with the fire times it missed."""

    ONE = "one"  # one run for the latest missed time
    NONE = "none"  # none: the missed times are counted and skipped
    ALL = "all"  # one run per missed time, up to runs.schedules.CATCH_UP_LIMIT


class Schedule(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        Tenant, on_delete=models.CASCADE, related_name="schedules", db_index=False
    )
    name = models.CharField(max_length=200, blank=True, default="")
    kind = models.CharField(max_length=100)
    input = models.JSONField(default=dict, blank=True)
    # Exactly one of the two (schedule_has_one_cadence).
    cron = models.CharField(max_length=120, blank=True, default="")
    every_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")  # an IANA name: the cron's clock
    enabled = models.BooleanField(default=True)
    overlap = models.CharField(max_length=20, choices=Overlap.choices, default=Overlap.SKIP)
    catch_up = models.CharField(max_length=10, choices=CatchUp.choices, default=CatchUp.ONE)
    # The next fire time (the database's clock); null while disabled.
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)  # the fire time of its last run
    fires = models.PositiveIntegerField(default=0)  # runs it submitted
    missed = models.PositiveIntegerField(default=0)  # fire times that made no run
    last_error = models.TextField(blank=True, default="")  # why its last fire made no run
    created_at = models.DateTimeField(default=django_timezone.now, editable=False)
    updated_at = models.DateTimeField(default=django_timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=(Q(cron="") & Q(every_seconds__isnull=False) & Q(every_seconds__gte=1))
                | (~Q(cron="") & Q(every_seconds__isnull=True)),
                name="schedule_has_one_cadence",
            ),
        ]
        indexes = [
            # The scheduler's pass: enabled schedules whose next fire time has come.
            models.Index(
                fields=["next_fire_at"], condition=Q(enabled=True), name="schedule_due_idx"
            ),
            models.Index(fields=["tenant", "created_at"], name="schedule_tenant_idx"),
        ]

    def __str__(self) -> str:
        return self.name or f"{self.kind} ({self.cron or f'every {self.every_seconds} s'})"
