"""LISTEN/NOTIFY wakes idle workers; a lost listener connection is re-established."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from runs.models import Run, Worker
from runs.services import submit_run
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_idle_worker_is_woken_by_notify_and_survives_losing_its_listener(tenant, processes):
    # With a 60 s poll, only a NOTIFY can get these runs started within the test's wait.
    worker = processes.worker("--poll", "60")
    wait_until(lambda: Worker.objects.exists(), what="the worker to register")
    wait_until(_listening, what="the LISTEN connection")

    first = submit_run(tenant=tenant, kind="echo", input={"text": "a"})
    wait_until(
        lambda: Run.objects.get(pk=first.pk).status == "done",
        timeout=20,
        what="a run woken by NOTIFY",
    )

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
        )
    wait_until(_listening, timeout=20, what="the LISTEN connection to come back")
    second = submit_run(tenant=tenant, kind="echo", input={"text": "b"})
    wait_until(
        lambda: Run.objects.get(pk=second.pk).status == "done",
        timeout=20,
        what="a run woken after reconnecting",
    )

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, processes.output(worker)
    assert "LISTEN connection lost" in processes.output(worker)


def _listening() -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN %%'"
            " AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0] == 1
