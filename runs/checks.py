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
