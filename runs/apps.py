from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The web process and the worker know the same kinds: both import
        # installed apps' agents.py and AGENT_MODULES here, and their tasks.py when
        # TASKS names this project's backend (each @task on it becomes a kind, runs.tasks).
        import runs.checks  # noqa: F401  (registers the system checks)
        import runs.threads.turns  # noqa: F401  (registers what a turn's end does to its thread)
        from runs.driver import raise_cache_limits
        from runs.registry import autodiscover
        from runs.tasks import autodiscover_tasks

        raise_cache_limits()  # psycopg's, for the engine's long statements (runs.driver)
        autodiscover()
        autodiscover_tasks()
