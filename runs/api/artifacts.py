"""Artifact endpoints of the runs Router: large tool outputs, listed and downloaded."""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from django.db.models import Q
from django.db.models.fields.json import KeyTextTransform
from django.http import FileResponse, Http404
from ninja import Schema

from runs import payloads, selectors
from runs.api.auth import ApiRequest
from runs.api.endpoints import ERRORS, require_scope, router
from runs.models import ApiKey, Artifact, Step


class ArtifactOut(Schema):
    id: int
    name: str
    content_type: str
    size: int
    sha256: str
    summary: str
    step: int | None = None
    created_at: datetime
    download_url: str


def _steps_by_artifact(run) -> dict[int, int]:
    """Seq of the step that produced each artifact.

    Tool steps record the artifact id in their output; a step output stored
    as an artifact is its reference (``runs.payloads``).
    """
    rows = (
        Step.objects.filter(run=run, generation=run.generation)
        .filter(Q(output__has_key="artifact_id") | Q(output__has_key=payloads.REFERENCE))
        .annotate(
            tool_artifact=KeyTextTransform("artifact_id", "output"),
            stored_as=KeyTextTransform(payloads.REFERENCE, "output"),
        )
        .values_list("tool_artifact", "stored_as", "seq")
    )
    return {
        int(artifact_id): seq
        for tool_artifact, stored_as, seq in rows
        for artifact_id in (tool_artifact, stored_as)
        if artifact_id is not None and str(artifact_id).isdigit()
    }


@router.get(
    "/runs/{run_id}/artifacts",
    response={200: list[ArtifactOut]} | ERRORS,
    summary="A run's artifacts",
)
def list_artifacts(request: ApiRequest, run_id: UUID):
    run = selectors.get_run(tenant=request.auth.tenant, run_id=run_id)
    require_scope(request, ApiKey.Scope.READ)
    producing = _steps_by_artifact(run)
    return [
        {
            "id": a.pk,
            "name": a.name,
            "content_type": a.content_type,
            "size": a.size,
            "sha256": a.sha256,
            "summary": a.summary,
            "step": a.step.seq if a.step is not None else producing.get(a.pk),
            "created_at": a.created_at,
            "download_url": f"/api/runs/{run.pk}/artifacts/{a.pk}",
        }
        for a in Artifact.objects.filter(run=run).select_related("step").order_by("id")
    ]


@router.get(
    "/runs/{run_id}/artifacts/{artifact_id}",
    response={200: None} | ERRORS,
    summary="Download an artifact",
)
def download_artifact(request: ApiRequest, run_id: UUID, artifact_id: int):
    run = selectors.get_run(tenant=request.auth.tenant, run_id=run_id)
    require_scope(request, ApiKey.Scope.READ)
    artifact = Artifact.objects.filter(run=run, pk=artifact_id).first()
    if artifact is None:
        raise Http404("artifact not found")
    response = FileResponse(
        artifact.file.open("rb"),
        as_attachment=True,
        filename=f"artifact-{artifact.pk}.{'json' if 'json' in artifact.content_type else 'txt'}",
        content_type=artifact.content_type,
    )
    # Model and tool output is untrusted: never let a browser sniff it into HTML.
    response["X-Content-Type-Options"] = "nosniff"
    response["X-Artifact-SHA256"] = artifact.sha256
    return response
