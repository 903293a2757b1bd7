"""The one NinjaAPI: routers mounted here, domain errors mapped to HTTP once."""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

import runs.api_artifacts  # noqa: F401  (registers the artifact endpoints on the runs router)
import runs.api_control  # noqa: F401  (registers the control endpoints on the runs router)
from runs.api import router as runs_router
from runs.exceptions import (
    IdempotencyConflict,
    InvalidRunInput,
    InvalidTransition,
    QueueFull,
    UnknownKind,
)

logger = logging.getLogger(__name__)

api = NinjaAPI(
    title="Agent runs",
    version="1",
    description="Durable AI agent runs: submit, then poll, stream or receive a webhook.",
    docs_url="/docs",
    urls_namespace="api",
)
api.add_router("/", runs_router)


def _error(request: HttpRequest, status: int, detail: str, **extra) -> HttpResponse:
    return api.create_response(request, {"detail": detail, **extra}, status=status)


@api.exception_handler(AuthenticationError)
def on_unauthenticated(request, exc):
    return _error(request, 401, "a valid API key is required: send 'Authorization: Bearer <key>'")


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _error(request, 404, str(exc) or "not found")


@api.exception_handler(HttpError)
def on_http_error(request, exc):
    return _error(request, exc.status_code, str(exc))


@api.exception_handler(ValidationError)
def on_validation_error(request, exc):
    errors = [
        {"loc": list(err.get("loc", [])), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in exc.errors
    ]
    if errors:
        first = errors[0]
        loc = [str(part) for part in first["loc"] if part not in ("body", "payload", "query", "filters", "path")]
        where = ".".join(loc) or "request"
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


@api.exception_handler(IdempotencyConflict)
def on_idempotency_conflict(request, exc):
    return _error(request, 409, str(exc))


@api.exception_handler(InvalidTransition)
def on_invalid_transition(request, exc):
    return _error(request, 409, str(exc))


@api.exception_handler(QueueFull)
def on_queue_full(request, exc):
    response = _error(request, 429, str(exc))
    response["Retry-After"] = str(exc.retry_after)
    return response


@api.exception_handler(RequestDataTooBig)
def on_too_big(request, exc):
    return _error(request, 413, "the request body is larger than the limit")
