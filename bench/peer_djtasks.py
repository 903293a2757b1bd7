"""django-tasks-db's side of bench/peers.py: two ``django.tasks`` tasks (settings: bench/peer_settings.py).

Worker (as bench/peers.py starts it, one OS process each)::

    DJANGO_SETTINGS_MODULE=bench.peer_settings DATABASE_URL=postgres://.../bench_<pid>_djtasks \\
        .venv/bin/python -m django db_worker --queue-name default --interval 1 --verbosity 0

``db_worker`` runs one task at a time and polls every ``--interval`` seconds
when the queue is empty (it has no LISTEN/NOTIFY and no concurrency setting).
"""

from __future__ import annotations

from django.tasks import task

from bench.peer_ping import send_ping


@task()
def noop(i: int) -> None:
    """The drain job: nothing."""
    return None


@task()
def ping(seq: int, port: int) -> None:
    """The dispatch probe: one UDP datagram to the bench."""
    send_ping(seq, port)
