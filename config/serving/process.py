"""The entry point of each spawned web process of ``serve --workers N`` (``config.serving.server.Supervisor``).

A module of its own that imports Django only once the process runs: a
spawned process finds its target by importing the target's module, before
anything has called ``django.setup()``.
"""

from __future__ import annotations


def run(config, sockets) -> None:
    import django

    django.setup()
    from config.serving.web import serve_process

    serve_process(config, sockets)
