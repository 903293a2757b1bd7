from django.apps import AppConfig


class ServingConfig(AppConfig):
    """``manage.py serve``: the production web server (``config.serving``)."""

    name = "config.serving"
    label = "serving"
