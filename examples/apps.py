from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    """The example kinds of ``examples/agents.py`` (found like any installed app's ``agents.py``)."""

    name = "examples"
    verbose_name = "Examples (RUNS_EXAMPLES=1)"
