"""Large tool outputs as Artifacts: stored through Django storage, shown to the model as an excerpt.

A tool output above ``RUNS_ARTIFACT_THRESHOLD_BYTES`` (default 8 KiB) is
written to the default storage (local ``MEDIA_ROOT``, or S3 through a
storage backend) with its size, sha256 and a summary. The model gets a
short excerpt plus the artifact id, and the step row keeps only that, so a
long run's conversation and step log stay small. People download the full
output at ``GET /api/runs/{id}/artifacts/{artifact_id}``.
"""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from runs.artifacts import read_artifact, save_artifact
from workers.llm import conf

__all__ = ["excerpt", "for_the_model", "read_artifact", "save_artifact", "summarize"]


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


def for_the_model(
    *, run_id: UUID, name: str, content: str, content_type: str = "text/plain"
) -> dict:
    """What a tool step records for ``content``: itself when small, else an excerpt and the artifact id."""
    data = content.encode("utf-8")
    if len(data) <= conf.get("RUNS_ARTIFACT_THRESHOLD_BYTES"):
        return {"content": content}
    artifact = save_artifact(
        run_id=run_id, name=name, data=data, content_type=content_type, summarize=summarize
    )
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
