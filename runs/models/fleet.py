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
    stopped_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"
