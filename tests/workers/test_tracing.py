"""OpenTelemetry (the ``otel`` extra): a run is traced under the request that submitted it, each step under the run."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "opentelemetry.sdk.trace", reason="the otel extra is not installed (pip install -e '.[otel]')"
)
pytest.importorskip(
    "opentelemetry.instrumentation.django", reason="the otel extra is not installed"
)

from opentelemetry import trace  # noqa: E402
from opentelemetry.instrumentation.django import DjangoInstrumentor  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.sdk.trace.sampling import (  # noqa: E402
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

from runs.models import Run  # noqa: E402
from runs.services import submit_run  # noqa: E402
from tests.conftest import fresh  # noqa: E402
from workers.worker import Worker, WorkerOptions  # noqa: E402

pytestmark = pytest.mark.django_db(transaction=True)


class Switch(Sampler):
    """Samples while on: the global provider outlives this module (it can be set once per process)."""

    on = False

    def should_sample(self, parent_context, trace_id, name, *args, **kwargs) -> SamplingResult:
        sampler = ParentBased(ALWAYS_ON) if self.on else ALWAYS_OFF
        return sampler.should_sample(parent_context, trace_id, name, *args, **kwargs)

    def get_description(self) -> str:
        return "Switch"


SWITCH = Switch()


@pytest.fixture(scope="module")
def exporter():
    """Finished spans, in memory; after this module no span records and none is kept."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider(sampler=SWITCH)
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    DjangoInstrumentor().instrument()
    SWITCH.on = True
    yield exporter
    SWITCH.on = False
    DjangoInstrumentor().uninstrument()
    exporter.shutdown()


@pytest.fixture
def spans(exporter):
    exporter.clear()
    yield exporter
    exporter.clear()


def submit(api, kind: str, input: dict) -> Run:
    response = api.post(
        "/api/runs",
        data=json.dumps({"kind": kind, "input": input}),
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    return Run.objects.get(pk=response.json()["id"])


def burst_worker() -> None:
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()


def named(spans, name: str) -> list:
    return [span for span in spans.get_finished_spans() if span.name == name]


def the_request(spans):
    [request] = [span for span in spans.get_finished_spans() if span.kind == SpanKind.SERVER]
    return request


def test_a_run_is_traced_under_the_request_that_submitted_it_and_its_steps_under_the_run(
    api, tenant, spans
):
    run = submit(api, "logs_in_step", {"name": "Ada"})
    request = the_request(spans)

    # The run carries the request span's W3C context.
    version, trace_id, span_id, flags = run.trace_context["traceparent"].split("-")
    assert (int(trace_id, 16), int(span_id, 16)) == (
        request.context.trace_id,
        request.context.span_id,
    )

    burst_worker()
    assert fresh(run).status == "done"
    [run_span] = named(spans, "run logs_in_step")
    [step_span] = named(spans, "step greet")
    [inside] = named(spans, "inside greet")  # opened by the step function, on the step's thread
    assert run_span.kind == SpanKind.CONSUMER
    assert run_span.parent.span_id == request.context.span_id
    assert step_span.parent.span_id == run_span.context.span_id
    assert inside.parent.span_id == step_span.context.span_id
    assert {run_span.context.trace_id, step_span.context.trace_id, inside.context.trace_id} == {
        request.context.trace_id
    }
    assert dict(run_span.attributes) == {
        "agentruns.run_id": str(run.id),
        "agentruns.tenant": str(tenant.id),
        "agentruns.kind": "logs_in_step",
        "agentruns.attempt": 1,
        "agentruns.queue": "default",
        "agentruns.worker": run_span.attributes["agentruns.worker"],
        "agentruns.run.status": "done",
    }
    assert (
        step_span.attributes["agentruns.step.seq"],
        step_span.attributes["agentruns.step.kind"],
        step_span.attributes["agentruns.step.status"],
    ) == (1, "custom", "done")
    assert step_span.status.status_code != StatusCode.ERROR


def test_a_failing_step_is_an_error_span_with_the_exception(api, spans):
    run = submit(api, "broken", {})

    burst_worker()
    assert fresh(run).status == "failed"
    [run_span] = named(spans, "run broken")
    [step_span] = named(spans, "step validate")
    assert step_span.parent.span_id == run_span.context.span_id
    assert step_span.status.status_code == StatusCode.ERROR
    assert "field 'email' is invalid" in step_span.status.description
    assert (
        step_span.attributes["agentruns.step.status"],
        step_span.attributes["agentruns.step.error_kind"],
    ) == ("failed", "fatal")
    [event] = step_span.events
    assert (event.name, event.attributes["exception.type"]) == ("exception", "workers.errors.Fatal")
    assert run_span.status.status_code == StatusCode.ERROR
    assert run_span.attributes["agentruns.run.status"] == "failed"


def test_a_child_run_is_traced_under_the_step_that_spawned_it(api, spans):
    parent = submit(api, "wf_parent", {"n": 1})
    request = the_request(spans)

    burst_worker()  # the parent spawns, waits, the child runs, the parent finishes
    assert fresh(parent).status == "done"
    [child] = Run.objects.filter(parent=parent)
    [spawn] = named(spans, "step spawn wf_child")
    [child_span] = named(spans, "run wf_child")
    parent_spans = named(spans, "run wf_parent")
    assert child.trace_context["traceparent"].split("-")[2] == f"{spawn.context.span_id:016x}"
    assert child_span.parent.span_id == spawn.context.span_id
    # Each claim of the parent is a span of its own under the request; all one trace.
    assert [s.attributes["agentruns.attempt"] for s in parent_spans] == [1, 2]
    assert {s.parent.span_id for s in parent_spans} == {request.context.span_id}
    assert {s.context.trace_id for s in [spawn, child_span, *parent_spans]} == {
        request.context.trace_id
    }


def test_a_run_submitted_with_no_span_recording_carries_no_context_and_its_span_is_a_root(
    tenant, spans
):
    run = submit_run(tenant=tenant, kind="noop3", input={})
    assert run.trace_context is None
    assert fresh(run).trace_context is None

    burst_worker()
    [run_span] = named(spans, "run noop3")
    assert run_span.parent is None
    assert [
        s.name
        for s in spans.get_finished_spans()
        if s.parent and s.parent.span_id == run_span.context.span_id
    ] == ["step one", "step two", "step three"]
