"""Large tool outputs as Artifacts: stored through Django storage, shown to the model as an excerpt.

A tool output above ``RUNS_ARTIFACT_THRESHOLD_BYTES`` (default 8 KiB) is
written to the default storage (local ``MEDIA_ROOT``, or S3 through a
storage backend) with its size, sha256 and a summary. The model gets a
short excerpt plus the artifact id, and the step row keeps only that, so a
long run's conversation and step log stay small. People download the full
output at ``GET /api/runs/{id}/artifacts/{artifact_id}``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any
from uuid import UUID

from django.core.files.base import ContentFile

from workers.llm import conf


def save_artifact(*, run_id: UUID, name: str, data: bytes, content_type: str = "text/plain",
                  summary: str = "") -> Any:
    """Store ``data`` as an Artifact of the run and return it.

    Idempotent per run, name and content: a step executed again after a
    crash finds the artifact its first execution stored.
    """
    from runs.models import Artifact

    digest = hashlib.sha256(data).hexdigest()
    existing = Artifact.objects.filter(run_id=run_id, name=name, sha256=digest).order_by("id").first()
    if existing is not None:
        return existing
    artifact = Artifact(
        run_id=run_id, name=name[:200], content_type=content_type, size=len(data), sha256=digest,
        summary=summary or summarize(data, content_type),
    )
    slug = re.sub(r"[^a-zA-Z0-9_-]+", "-", name).strip("-")[:60] or "output"
    artifact.file.save(f"{run_id}-{digest[:12]}-{slug}.txt", ContentFile(data), save=True)
    return artifact


def read_artifact(*, run_id: UUID, artifact_id: int) -> bytes:
    """The full content of one of the run's artifacts."""
    from runs.models import Artifact

    artifact = Artifact.objects.get(run_id=run_id, pk=artifact_id)
    with artifact.file.open("rb") as fh:
        return fh.read()


def summarize(data: bytes, content_type: str = "text/plain") -> str:
    """One line a person (and the model) can judge the content by, without reading it."""
    text = data.decode("utf-8", errors="replace")
    if content_type == "application/json":
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, list):
            return f"JSON array of {len(value)} items, {len(data)} bytes"
        if isinstance(value, dict):
            keys = ", ".join(list(value)[:8])
            return f"JSON object with keys {keys}; {len(data)} bytes"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{text.count(chr(10)) + 1} lines, {len(data)} bytes; begins: {first[:120]}"


def for_the_model(*, run_id: UUID, name: str, content: str, content_type: str = "text/plain") -> dict:
    """What a tool step records for ``content``: itself when small, else an excerpt and the artifact id."""
    data = content.encode("utf-8")
    if len(data) <= conf.get("RUNS_ARTIFACT_THRESHOLD_BYTES"):
        return {"content": content}
    artifact = save_artifact(run_id=run_id, name=name, data=data, content_type=content_type)
    return {"content": excerpt(artifact, content), "artifact_id": artifact.pk}


def excerpt(artifact: Any, content: str) -> str:
    limit = conf.get("RUNS_ARTIFACT_EXCERPT_CHARS")
    shown = content[:limit]
    return (
        f"[The output is too large to show: stored as artifact {artifact.pk} "
        f"({artifact.size} bytes, sha256 {artifact.sha256[:16]}). {artifact.summary}]\n"
        f"Excerpt (the first {len(shown)} of {len(content)} characters):\n"
        f"{shown}\n"
        f"[... {len(content) - len(shown)} more characters in artifact {artifact.pk}]"
    )
