"""The trace context a run carries from where it was submitted (``Run.trace_context``).

With OpenTelemetry installed (the ``otel`` extra) and a span recording when
a run is created (the request's span under ``DjangoInstrumentor``, a
worker's step span for a child run), the run stores that span's W3C
carrier (``{"traceparent": ..., "tracestate": ...}``); the worker that
executes it opens the run's span under it (``workers.tracing``). Without
OpenTelemetry, or with no span recording (no SDK configured, sampled out),
it stores NULL.
"""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _opentelemetry() -> tuple[Any, Any] | None:
    # Imported on first use: the extra is optional, and the propagators are loaded by entry points.
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return trace, propagate


def current_trace_context() -> dict[str, str] | None:
    """The W3C carrier of the current span when one is recording, else None."""
    otel = _opentelemetry()
    if otel is None:
        return None
    trace, propagate = otel
    if not trace.get_current_span().is_recording():
        return None
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier or None
