"""The one NinjaAPI: routers mounted here, domain errors mapped to HTTP once."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError, DataError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

import runs.api.artifacts  # noqa: F401  (registers the artifact endpoints on the runs router)
import runs.api.control  # noqa: F401  (registers the control endpoints on the runs router)
import runs.api.schedules  # noqa: F401  (registers the schedule endpoints on the runs router)
import runs.api.streams  # noqa: F401  (registers the event stream endpoints on the runs router)
import runs.api.threads  # noqa: F401  (registers the conversation endpoints on the runs router)
from runs.api.endpoints import router as runs_router
from runs.db import is_transient
from runs.engine.keys import ConcurrencyKeyTaken
from runs.exceptions import (
    IdempotencyConflict,
    InvalidRunInput,
    InvalidTransition,
    PayloadTooLarge,
    QueueFull,
    UnknownKind,
)
from runs.threads import TurnLive

logger = logging.getLogger(__name__)

api = NinjaAPI(
    title="Agent runs",
    version="1",
    description="Durable AI agent runs: submit, then poll, stream or receive a webhook.",
    docs_url="/docs" if settings.RUNS_API_DOCS else None,
    openapi_url="/openapi.json" if settings.RUNS_API_DOCS else None,
    urls_namespace="api",
)
api.add_router("/", runs_router)


def _error(request: HttpRequest, status: int, detail: str, **extra) -> HttpResponse:
    return api.create_response(request, {"detail": detail, **extra}, status=status)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return _error(
        request,
        401,
        "a valid API key is required: send 'Authorization: Bearer <key>' (or log in to "
        "the dashboard and use its session)",
    )


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _error(request, 404, str(exc) or "not found")


@api.exception_handler(HttpError)
def on_http_error(request, exc):
    return _error(request, exc.status_code, str(exc))


# The parts of a validation error's location that say where ninja read it, not which field.
PARAMETER_SOURCES = ("body", "payload", "query", "filters", "path", "header")


@api.exception_handler(ValidationError)
def on_validation_error(request, exc):
    errors = [
        {"loc": list(err.get("loc", [])), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors
    ]
    if errors:
        first = errors[0]
        loc = [str(part) for part in first["loc"] if part not in PARAMETER_SOURCES]
        where = ".".join(loc) or "request"
        if first["type"] == "unstorable":
            # runs.api.schemas.StorableIn: the message names the field, and the place inside it.
            detail = f"invalid request: {first['msg']}"
        else:
            detail = f"invalid request: {where}: {first['msg']}"
    else:
        detail = "invalid request"
    return _error(request, 422, detail, errors=errors)


@api.exception_handler(UnknownKind)
def on_unknown_kind(request, exc):
    return _error(request, 422, str(exc))


@api.exception_handler(InvalidRunInput)
def on_invalid_input(request, exc):
    return _error(request, 422, str(exc), errors=exc.errors)


# The run's input past RUNS_PAYLOAD_MAX_BYTES (runs.payloads): too large like a body past the body limit.
@api.exception_handler(PayloadTooLarge)
def on_payload_too_large(request, exc):
    return _error(request, 413, str(exc))


@api.exception_handler(IdempotencyConflict)
def on_idempotency_conflict(request, exc):
    return _error(request, 409, str(exc))


@api.exception_handler(InvalidTransition)
def on_invalid_transition(request, exc):
    if isinstance(exc, TurnLive):  # a thread's reject policy: the live turn is named
        return _error(request, 409, str(exc), run_id=str(exc.run_id), turn=exc.turn)
    if isinstance(exc, ConcurrencyKeyTaken):  # a key's reject policy: the live run is named
        return _error(request, 409, str(exc), run_id=str(exc.run_id))
    return _error(request, 409, str(exc))


@api.exception_handler(QueueFull)
def on_queue_full(request, exc):
    response = _error(request, 429, str(exc))
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(RequestDataTooBig)
def on_too_big(request, exc):
    return _error(request, 413, "the request body is larger than the limit")


# Input the schemas let through but PostgreSQL refuses (a number out of a
# column's range, text it cannot encode). The schemas and runs.text are the
# first line (runs.api.schemas.StorableIn); this keeps a gap in them a 422, and
# the warning shows where the gap is.
@api.exception_handler(DataError)
def on_data_error(request, exc):
    logger.warning(
        "the database refused a value of %s %s", request.method, request.path, exc_info=exc
    )
    return _error(
        request,
        422,
        "a value in the request cannot be stored: a number out of range, or text with a "
        "NUL character or a lone surrogate",
    )


# A deadlock detected by PostgreSQL (a person's transition of a child run and a
# worker's heartbeat of its parent, runs.engine.family), a serialization
# failure or a connection lost in a failover: nothing was written, and the
# same request a moment later succeeds. Anything else stays a server error.
@api.exception_handler(DatabaseError)
def on_database_error(request, exc):
    if not is_transient(exc):
        raise exc
    logger.warning("transient database error in %s %s: %s", request.method, request.path, exc)
    response = _error(
        request, 503, "the database could not complete the request just now: retry in a moment"
    )
    response["Retry-After"] = "1"
    return response


@api.exception_handler(UnicodeEncodeError)
def on_unencodable_text(request, exc):
    logger.warning("unencodable text in %s %s", request.method, request.path, exc_info=exc)
    return _error(
        request, 422, "the request contains text that cannot be encoded as UTF-8 (a lone surrogate)"
    )


def not_found(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """Any other path under /api/: the API's JSON 404 rather than Django's HTML page."""
    return _error(request, 404, "no such API endpoint")
