"""Oversized tool output becomes an Artifact: stored with its digest, excerpted for the model, served by the API."""

from __future__ import annotations

import hashlib
import json

import pytest
from django.test import Client

from runs.keys import create_api_key
from runs.models import Artifact, Step
from runs.services import submit_run
from tests.support.agents_llm import MARKER
from tests.support.factories import TenantFactory
from tests.support.fake_openai import drive, say

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("media_root")]


def tool_answers(body):
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def run_dump(tenant, fake_llm, size):
    fake_llm.enqueue(say(None, ("dump", {"size": size})), say("summarised"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    assert run.status == "done", run.error
    return run


def test_an_oversized_tool_output_becomes_an_artifact_and_the_model_gets_an_excerpt(
    tenant, fake_llm
):
    run = run_dump(tenant, fake_llm, 50_000)
    artifact = Artifact.objects.get(run=run)
    with artifact.file.open("rb") as fh:
        data = fh.read()
    assert len(data) == artifact.size == 50_000 and data.endswith(MARKER.encode())
    assert artifact.sha256 == hashlib.sha256(data).hexdigest()
    lines = data.count(b"\n") + 1
    assert (
        artifact.summary
        == f"{lines} lines, 50000 bytes; begins: 0123456789 the quick brown fox jumps over the lazy dog"
    )

    # The next request carries only the excerpt and the artifact id (checked on the wire).
    second = fake_llm.bodies()[1]
    [told] = tool_answers(second)
    assert f"stored as artifact {artifact.pk}" in told
    assert len(told) < 2000 and data.decode()[:500] in told
    assert MARKER not in json.dumps(second)
    # The step row keeps the same small record, not the output.
    step = Step.objects.get(run=run, name="Calling dump")
    assert step.output == {"content": told, "artifact_id": artifact.pk}
    assert run.result["tool_calls"][0]["artifact_id"] == artifact.pk


def test_output_up_to_the_threshold_stays_inline(tenant, fake_llm):
    run_dump(tenant, fake_llm, 8192)
    assert not Artifact.objects.exists()
    [told] = tool_answers(fake_llm.bodies()[1])
    assert len(told) == 8192 and told.endswith(MARKER)


def test_the_threshold_is_a_setting(tenant, fake_llm, settings):
    settings.RUNS_ARTIFACT_THRESHOLD_BYTES = 100
    run_dump(tenant, fake_llm, 101)
    assert Artifact.objects.get().size == 101


def test_the_api_lists_and_serves_a_runs_artifacts(tenant, api, fake_llm):
    run = run_dump(tenant, fake_llm, 20_000)
    artifact = Artifact.objects.get(run=run)
    listing = api.get(f"/api/runs/{run.pk}/artifacts")
    assert listing.status_code == 200
    [item] = listing.json()
    assert item | {"created_at": None} == {
        "id": artifact.pk,
        "name": artifact.name,
        "content_type": "text/plain",
        "size": 20_000,
        "sha256": artifact.sha256,
        "summary": artifact.summary,
        "step": Step.objects.get(run=run, name="Calling dump").seq,
        "created_at": None,
        "download_url": f"/api/runs/{run.pk}/artifacts/{artifact.pk}",
    }
    download = api.get(item["download_url"])
    assert download.status_code == 200
    body = b"".join(download.streaming_content)
    assert hashlib.sha256(body).hexdigest() == artifact.sha256 == download["X-Artifact-SHA256"]
    assert download["Content-Type"] == "text/plain"
    assert download["X-Content-Type-Options"] == "nosniff"
    assert "attachment" in download["Content-Disposition"]


def test_artifacts_of_another_tenants_run_are_not_found(tenant, api, fake_llm):
    other = TenantFactory()
    run = run_dump(other, fake_llm, 20_000)
    artifact = Artifact.objects.get(run=run)
    assert api.get(f"/api/runs/{run.pk}/artifacts").status_code == 404
    assert api.get(f"/api/runs/{run.pk}/artifacts/{artifact.pk}").status_code == 404
    owner = Client(
        headers={"Authorization": f"Bearer {create_api_key(tenant=other, name='o').secret}"}
    )
    assert owner.get(f"/api/runs/{run.pk}/artifacts/{artifact.pk + 1000}").status_code == 404
    assert owner.get(f"/api/runs/{run.pk}/artifacts").json()[0]["id"] == artifact.pk
    assert Client().get(f"/api/runs/{run.pk}/artifacts").status_code == 401
