"""What an execution of a run tells the logs and, with OpenTelemetry, the traces.

Logs: the run's fields (``run_id``, ``tenant``, ``kind``, ``attempt``,
``worker``) are bound with ``structlog.contextvars`` for the whole
execution, and ``step`` and ``seq`` while a step executes, so that every
line logged meanwhile carries them (config/logging.py merges them into
stdlib lines too), whoever logs it: the engine, a library, agent code. The
execution runs in a copy of the thread's context, so nothing bound for one
run outlives it on a pool thread that runs another next; a step function
runs in a copy of its run's (``workers.step_thread.call_step``), so its lines carry
the fields on the step's thread as well.

Traces, when ``opentelemetry`` is importable (the ``otel`` extra): each
execution is a span ``run <kind>`` whose parent is the context the run
carries from where it was submitted (``Run.trace_context``,
``runs.tracing``), and each step executed (not replayed) a child span
``step <name>``, current while the step function runs (spans it opens
nest under it). With no tracer provider configured these are the API's
no-op spans.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import TYPE_CHECKING, Any, Protocol
from uuid import UUID

import structlog

if TYPE_CHECKING:
    from runs.engine.claim import ClaimedRun
    from runs.engine.steps import StepRecord

STEP_STATUS = "agentruns.step.status"


@cache
def _api() -> tuple[Any, Any, Any] | None:
    # Imported on first use (the propagators load through entry points): the extra is optional.
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    # A ProxyTracer: it follows the provider configured later (opentelemetry-instrument, tests).
    return trace, propagate, trace.get_tracer("agentruns.workers")


def _opentelemetry() -> tuple[Any, Any, Any] | None:
    """The API once a tracer provider is configured; until then not even a no-op span is made."""
    api = _api()
    if api is None:
        return None
    trace = api[0]
    if isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    ):
        return None
    return api


def observed_run[S: str | None](
    claimed: ClaimedRun, *, worker_id: UUID, execute: Callable[[], S]
) -> S:
    """``execute()`` in a context of its own, its lines carrying the run's fields, inside the span ``run <kind>``."""
    return contextvars.copy_context().run(_observed_run, claimed, worker_id, execute)


def _observed_run[S: str | None](
    claimed: ClaimedRun, worker_id: UUID, execute: Callable[[], S]
) -> S:
    structlog.contextvars.bind_contextvars(
        run_id=str(claimed.id),
        tenant=str(claimed.tenant_id),
        kind=claimed.kind,
        attempt=claimed.attempt,
        worker=str(worker_id),
    )
    otel = _opentelemetry()
    if otel is None:
        return execute()
    trace, propagate, tracer = otel
    parent = propagate.extract(claimed.trace_context) if claimed.trace_context else None
    attributes = {
        "agentruns.run_id": str(claimed.id),
        "agentruns.tenant": str(claimed.tenant_id),
        "agentruns.kind": claimed.kind,
        "agentruns.attempt": claimed.attempt,
        "agentruns.queue": claimed.queue,
        "agentruns.worker": str(worker_id),
    }
    # A consumer span: the run was queued by whoever submitted it, and is processed here.
    with tracer.start_as_current_span(
        f"run {claimed.kind}", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    ) as span:
        status = execute()
        span.set_attribute("agentruns.run.status", status or "lease_lost")
        if status == "failed":
            span.set_status(trace.Status(trace.StatusCode.ERROR, "the run failed"))
        return status


class FailureSource(Protocol):
    """What a step's span reads of the recorder running it (``workers.recording.StepRecorder``)."""

    @property
    def last_failure(self) -> Any: ...  # a workers.recording.StepFailure, or None


@contextmanager
def observed_step(ctx: FailureSource, record: StepRecord) -> Iterator[None]:
    """While step ``record`` executes: ``step`` and ``seq`` on every line, and the span ``step <name>``."""
    tokens = structlog.contextvars.bind_contextvars(step=record.name, seq=record.seq)
    try:
        otel = _opentelemetry()
        if otel is None:
            yield
            return
        trace, _, tracer = otel
        failed_before = ctx.last_failure
        attributes = {
            "agentruns.step.seq": record.seq,
            "agentruns.step.name": record.name,
            "agentruns.step.kind": record.kind,
        }
        # Exceptions are recorded below, not by the span: a signal (a lost lease, a release) is no error.
        with tracer.start_as_current_span(
            f"step {record.name}",
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except BaseException as exc:
                failure = ctx.last_failure if ctx.last_failure is not failed_before else None
                _step_failed(trace, span, exc, failure)
                raise
            span.set_attribute(STEP_STATUS, "done")
    finally:
        structlog.contextvars.reset_contextvars(**tokens)


def _step_failed(trace: Any, span: Any, exc: BaseException, failure: Any) -> None:
    if failure is not None:  # the step raised, and was recorded failed, or waiting for a person
        error: BaseException = failure.exc
        span.set_attribute(
            STEP_STATUS, "waiting" if failure.error_kind == "ambiguous" else "failed"
        )
        span.set_attribute("agentruns.step.error_kind", failure.error_kind)
    elif isinstance(exc, Exception):  # an engine statement failed around it
        error = exc
        span.set_attribute(STEP_STATUS, "failed")
    else:  # a signal: the lease was lost, the run released
        span.set_attribute(STEP_STATUS, "interrupted")
        span.set_attribute("agentruns.step.interrupted_by", type(exc).__name__)
        return
    span.record_exception(error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, f"{type(error).__name__}: {error}"))
