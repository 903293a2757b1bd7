"""Serving the project over HTTP: ``manage.py serve``, the production web server (uvicorn over ``config.asgi``).

An app of its own (installed as ``config.serving``) so that its command
lives beside the project's configuration rather than in the run domain:

- ``server``: ``serve()``, one process or a ``Supervisor`` of several;
- ``web``: one web process, uvicorn's server that ends its event streams
  and publishes its metrics;
- ``process``: the entry point of each spawned process of ``--workers N``.

Like the rest of ``config``, it never imports ``workers``.
"""
