from django.apps import AppConfig


class ExamplesConfig(AppConfig):
    """The example kinds of ``examples/agents.py`` (found like any installed app's ``agents.py``)."""

    name = "examples"
    verbose_name = "Examples (RUNS_EXAMPLES=1)"

    def ready(self) -> None:
        from examples.demo import add_demo_thread
        from runs.seed import demo_seeded

        demo_seeded.connect(add_demo_thread, dispatch_uid="examples.demo_thread")
