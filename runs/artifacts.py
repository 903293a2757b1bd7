"""A run's artifacts: large step or tool outputs kept out of the step rows, in Django's storage."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from uuid import UUID

from django.core.files.base import ContentFile

from runs.models import Artifact


def save_artifact(
    *,
    run_id: UUID,
    name: str,
    data: bytes,
    content_type: str = "text/plain",
    summary: str = "",
    summarize: Callable[[bytes, str], str] | None = None,
) -> Artifact:
    """Store ``data`` as an Artifact of the run and return it.

    Idempotent per run, name and content: a step executed again after a
    crash finds the artifact its first execution stored.
    """
    digest = hashlib.sha256(data).hexdigest()
    existing = (
        Artifact.objects.filter(run_id=run_id, name=name, sha256=digest).order_by("id").first()
    )
    if existing is not None:
        return existing
    artifact = Artifact(
        run_id=run_id,
        name=name[:200],
        content_type=content_type,
        size=len(data),
        sha256=digest,
        summary=summary or (summarize(data, content_type) if summarize else ""),
    )
    slug = re.sub(r"[^a-zA-Z0-9_-]+", "-", name).strip("-")[:60] or "output"
    artifact.file.save(f"{run_id}-{digest[:12]}-{slug}.txt", ContentFile(data), save=True)
    return artifact


def read_artifact(*, run_id: UUID, artifact_id: int) -> bytes:
    """The full content of one of the run's artifacts."""
    artifact = Artifact.objects.get(run_id=run_id, pk=artifact_id)
    with artifact.file.open("rb") as fh:
        return fh.read()
