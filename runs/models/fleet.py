"""The worker processes, as they register and heartbeat."""

from __future__ import annotations

import uuid

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone


class Worker(models.Model):
    """A worker process; a restarted process registers under a new id."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = ArrayField(models.CharField(max_length=64), default=list)
    kinds = ArrayField(models.CharField(max_length=100), default=list)
    concurrency = models.PositiveIntegerField()
    started_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    runs_held = models.PositiveIntegerField(default=0)
    # The worker's lease, renewed by its heartbeat: every run it holds is its
    # own while this is in the future, whatever the run's own locked_until says
    # (runs.engine.claim.heartbeat; the reaper's rescue, runs/sql/exit.sql).
    lease_until = models.DateTimeField(null=True, blank=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"


class MetricSnapshot(models.Model):
    """What one process counted (runs.metrics): its Prometheus samples, written every few seconds.

    ``GET /metrics`` sums the rows of every process, live and gone, so a
    counter never goes down when a worker restarts; the reaper folds rows of
    processes long gone into one row (``RETIRED``) to keep the table small.
    """

    RETIRED = uuid.UUID(int=0)

    process = models.UUIDField(primary_key=True)
    role = models.CharField(max_length=32)  # worker, reaper, webhooks, web
    host = models.CharField(max_length=255, blank=True, default="")
    pid = models.PositiveIntegerField(default=0)
    samples = models.JSONField(default=list)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.role} {self.host}:{self.pid}"
