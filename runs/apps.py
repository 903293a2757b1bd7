from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The web process and the worker know the same kinds: both import
        # installed apps' agents.py and AGENT_MODULES here.
        from runs.registry import autodiscover

        autodiscover()
