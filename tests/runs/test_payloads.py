"""Payloads over RUNS_PAYLOAD_INLINE_BYTES are Artifacts wherever they arise (runs.payloads), on real workers.

- A step's 1 MiB output is an Artifact and its row holds a reference; a run
  resumed after its worker was SIGKILLed replays that very value.
- A 300 KiB input sent to ``POST /api/runs`` is an Artifact; the agent
  receives all of it.
- A result over the limit is an Artifact too, readable at its reference's URL.
- Past RUNS_PAYLOAD_MAX_BYTES a step output fails its step ``fatal`` on the
  first attempt, and an input is a 413 that writes nothing.
- A reference never reads another tenant's artifact.
"""

from __future__ import annotations

import json
import signal
from uuid import uuid4

import pytest
from django.test import Client
from django.utils import timezone

from runs import payloads
from runs.keys import create_api_key
from runs.models import Artifact, Event, Run, Step, StepAttempt
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents_payloads import digest
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

MiB = 1024 * 1024


def words(nbytes: int) -> str:
    """About ``nbytes`` of text in short words (the run search indexes an input's words)."""
    return " ".join(f"w{i % 1000:03d}" for i in range(nbytes // 5))


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    """One storage for the test process and its workers."""
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return settings.MEDIA_ROOT


def worker_env(media: str, **extra) -> dict:
    return {"MEDIA_ROOT": media, "RUNS_BACKOFF_BASE_SECONDS": "0.05", **extra}


def stored_output(run: Run, seq: int):
    """The step's output column as PostgreSQL holds it, and its size there."""
    step = Step.objects.get(run=run, seq=seq)
    return step.output, len(json.dumps(step.output))


def download(client: Client, url: str) -> bytes:
    response = client.get(url)
    assert response.status_code == 200, response.content[:500]
    return b"".join(response.streaming_content)


def executions(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_a_1_mib_step_output_is_an_artifact_and_replays_after_a_sigkill(
    tenant, api, processes, tmp_path, media
):
    log = tmp_path / "big.log"
    block = tmp_path / "block"
    block.touch()
    run = submit_run(
        tenant=tenant,
        kind="payload_big_step",
        input={"log": str(log), "bytes": MiB, "block_file": str(block)},
    )
    first = processes.worker(
        "--lease", "3", "--heartbeat", "1", "--poll", "0.2", **worker_env(media)
    )
    wait_until(
        lambda: fresh(run).steps_done == 1,
        what=lambda: f"step 1 to be checkpointed\n{processes.output(first)}",
    )

    # The step row holds a small reference; the megabyte is one Artifact of the run.
    output, size = stored_output(run, 1)
    assert size < 1024, output
    [artifact] = Artifact.objects.filter(run=run)
    assert payloads.is_reference(output) and output["$artifact"] == artifact.pk
    assert artifact.size == output["bytes"] > MiB
    assert artifact.content_type == "application/json" and output["sha256"] == artifact.sha256
    [first_execution] = executions(log)

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    block.unlink()
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once", **worker_env(media))
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr

    second = processes.worker("--burst", **worker_env(media))
    assert second.wait(60) == 0, processes.output(second)
    run = fresh(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    # Step 1 ran once; the second worker replayed the very value it returned, read from the artifact.
    assert executions(log) == [first_execution]
    assert run.result == {"sha256": first_execution["sha256"], "chars": MiB}
    assert Artifact.objects.filter(run=run).count() == 1

    # The audit trail shows the reference; its URL serves the value, byte for byte what was stored.
    steps = api.get(f"/api/runs/{run.pk}/steps").json()["items"]
    shown = steps[0]["output"]
    assert shown == output and shown["url"] == f"/api/runs/{run.pk}/artifacts/{artifact.pk}"
    assert digest(json.loads(download(api, shown["url"]))) == first_execution["sha256"]
    listed = api.get(f"/api/runs/{run.pk}/artifacts").json()
    assert [(a["id"], a["step"]) for a in listed] == [(artifact.pk, 1)]


def test_a_300_kib_input_posted_to_the_api_is_an_artifact_and_the_agent_gets_all_of_it(
    tenant, api, processes, settings, media
):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = (
        MiB  # an operator's RUNS_MAX_BODY_BYTES above the 256 KiB default
    )
    data = {"text": words(300 * 1024), "n": 7}
    response = api.post(
        "/api/runs", {"kind": "payload_echo_input", "input": data}, content_type="application/json"
    )
    assert response.status_code == 202, response.content
    run = Run.objects.get(pk=response.json()["id"])
    [artifact] = Artifact.objects.filter(run=run)
    assert run.input == payloads.reference_of(artifact) and artifact.name == "input"
    assert len(json.dumps(run.input)) < 1024

    worker = processes.worker("--burst", **worker_env(media))
    assert worker.wait(60) == 0, processes.output(worker)
    run = fresh(run)
    assert run.status == "done", run.error
    assert run.result == {
        "sha256": digest(data),
        "chars": len(json.dumps(data)),
        "keys": ["n", "text"],
    }


def test_a_result_over_the_limit_is_an_artifact_the_user_reads_at_its_url(
    tenant, api, processes, media
):
    run = submit_run(tenant=tenant, kind="payload_big_result", input={"bytes": 300 * 1024})
    worker = processes.worker("--burst", **worker_env(media))
    assert worker.wait(60) == 0, processes.output(worker)
    run = fresh(run)
    assert run.status == "done", run.error
    [artifact] = Artifact.objects.filter(run=run, name="result")
    assert payloads.is_reference(run.result) and run.result["$artifact"] == artifact.pk

    shown = api.get(f"/api/runs/{run.pk}").json()["result"]
    assert shown == run.result
    assert json.loads(download(api, shown["url"])) == {"text": "r" * (300 * 1024)}
    # The run.done Event (and so its webhook and stream) carries the reference, not the megabytes.
    done = Event.objects.get(run=run, type="run.done")
    assert done.payload["result"] == run.result


def test_a_step_output_past_the_cap_fails_the_step_fatal_on_its_first_attempt(
    tenant, processes, tmp_path, media
):
    log = tmp_path / "big.log"
    run = submit_run(
        tenant=tenant, kind="payload_big_step", input={"log": str(log), "bytes": 2 * MiB}
    )
    worker = processes.worker("--burst", **worker_env(media, RUNS_PAYLOAD_MAX_BYTES=str(MiB)))
    assert worker.wait(60) == 0, processes.output(worker)
    run = fresh(run)
    assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1), run.error
    assert len(executions(log)) == 1  # not retried
    step = Step.objects.get(run=run, seq=1)
    assert step.status == "failed" and step.output is None
    for error in (step.error, run.error):
        assert "the output of step 1 (big)" in error, error
        assert f"over the limit of {MiB} bytes" in error and "RUNS_PAYLOAD_MAX_BYTES" in error, (
            error
        )
    [attempt] = StepAttempt.objects.filter(run=run)
    assert attempt.error_kind == "fatal"
    assert not Artifact.objects.filter(run=run).exists()


def test_an_input_past_the_cap_is_a_413_and_writes_nothing(tenant, api, settings):
    # The body limit lets it in (an operator raised RUNS_MAX_BODY_BYTES); the payload cap does not.
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = MiB
    settings.RUNS_PAYLOAD_MAX_BYTES = 300 * 1024
    response = api.post(
        "/api/runs",
        {"kind": "payload_echo_input", "input": {"text": words(400 * 1024)}},
        content_type="application/json",
    )
    assert response.status_code == 413, response.content
    detail = response.json()["detail"]
    assert "the run's input is" in detail and "over the limit of 307200 bytes" in detail, detail
    assert not Run.objects.exists() and not Artifact.objects.exists() and not Event.objects.exists()


def test_a_reference_never_reads_another_tenants_artifact(tenant, api, processes, tmp_path, media):
    # Tenant A's run stores a large step output as an artifact.
    run_a = submit_run(
        tenant=tenant, kind="payload_big_step", input={"log": str(tmp_path / "a.log"), "bytes": MiB}
    )
    worker = processes.worker("--burst", **worker_env(media))
    assert worker.wait(60) == 0, processes.output(worker)
    output_a, _ = stored_output(run_a, 1)
    assert payloads.is_reference(output_a), "tenant A's step output is not stored as an artifact"

    # Tenant B submits A's reference, exactly, as its input.
    other = TenantFactory()
    api_b = Client(
        headers={"Authorization": f"Bearer {create_api_key(tenant=other, name='b').secret}"}
    )
    response = api_b.post(
        "/api/runs",
        {"kind": "payload_echo_input", "input": output_a},
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    run_b = Run.objects.get(pk=response.json()["id"])
    # Stored as B's own artifact, so it stays B's value: a reference-shaped value is never trusted inline.
    assert run_b.input["$artifact"] != output_a["$artifact"]
    worker = processes.worker("--burst", **worker_env(media))
    assert worker.wait(60) == 0, processes.output(worker)
    run_b = fresh(run_b)
    assert run_b.status == "done", run_b.error
    assert run_b.result["sha256"] == digest(output_a)  # what B sent, not A's megabyte

    # Resolving A's reference for B's run is refused, and so is B's download of it.
    with pytest.raises(payloads.MissingPayload):
        payloads.resolve(output_a, run_id=run_b.pk)
    assert payloads.resolve(output_a, run_id=run_a.pk)["blob"]
    assert api_b.get(output_a["url"]).status_code == 404
    assert api_b.get(f"/api/runs/{run_b.pk}/artifacts/{output_a['$artifact']}").status_code == 404


def test_a_changed_payload_limit_holds_at_once_though_the_limits_are_read_once(settings):
    """The limits are read once per process (a checkpoint asks for them twice a step), again when changed."""
    text = json.dumps({"text": "x" * 600})
    run_id = uuid4()
    assert payloads.stored_step_input_json(text, run_id=run_id, seq=1) == text
    settings.RUNS_PAYLOAD_MAX_BYTES = 500
    stored = json.loads(payloads.stored_step_input_json(text, run_id=run_id, seq=1))
    assert "x" * 600 not in json.dumps(stored) and "500" in json.dumps(stored), stored
