"""Django system checks of the run domain (``manage.py check``; ``--deploy`` adds the deployment ones)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks


@checks.register(checks.Tags.security, deploy=True)
def examples_in_production(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """The example kinds and demo apps with DEBUG off: every tenant could start them and reach their tables."""
    if getattr(settings, "RUNS_EXAMPLES", False) and not settings.DEBUG:
        return [
            checks.Warning(
                "RUNS_EXAMPLES is on with DEBUG off: the example kinds (research*, crm_update, deploy_app, the "
                "framework demos) and the demo apps crm and deploys are installed, and every tenant may start them.",
                hint="Unset RUNS_EXAMPLES in production; it is for development (make run sets it).",
                id="runs.W201",
            )
        ]
    return []


@checks.register()
def payload_limits(app_configs, **kwargs) -> list[checks.CheckMessage]:
    """The payload limits (runs.payloads) against each other and against the request body limit."""
    inline, cap = settings.RUNS_PAYLOAD_INLINE_BYTES, settings.RUNS_PAYLOAD_MAX_BYTES
    body = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    found: list[checks.CheckMessage] = []
    if inline > cap:
        found.append(
            checks.Error(
                f"RUNS_PAYLOAD_INLINE_BYTES ({inline}) is over RUNS_PAYLOAD_MAX_BYTES ({cap}): "
                "values the inline limit would keep in their rows are refused by the cap.",
                hint="Keep the inline limit (256 KiB by default) below the cap (64 MiB by default).",
                id="runs.E202",
            )
        )
    if body is not None and body > cap:
        found.append(
            checks.Warning(
                f"RUNS_MAX_BODY_BYTES ({body}) is over RUNS_PAYLOAD_MAX_BYTES ({cap}): a request body "
                "between the two is read whole, then its run input refused (413) by the payload cap.",
                hint="Keep the body limit at or below the payload cap, so that the body limit refuses "
                "such a request before reading it.",
                id="runs.W203",
            )
        )
    return found
