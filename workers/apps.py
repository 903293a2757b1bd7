from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "workers"

    def ready(self) -> None:
        from workers.registry import autodiscover

        autodiscover()
