import threading

import psycopg
import pytest
from django.db import connection, connections

from runs.engine import claim as claims
from runs.engine.exit import Exit, leave
from runs.models import Tenant
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.worker import Worker, WorkerOptions


@pytest.mark.django_db(transaction=True)
def test_burst_worker_in_process_finishes_a_run(tenant):
    run = submit_run(tenant=tenant, kind="echo", input={"text": "hi", "times": 2})
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()
    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"echo": "hihi"}
    assert run.steps_done == 1


def _connect(name: str) -> psycopg.Connection:
    params = connections["default"].get_connection_params()
    for key in ("cursor_factory", "context", "pool", "prepare_threshold"):
        params.pop(key, None)
    params["application_name"] = name
    return psycopg.connect(**params, autocommit=True)


def _claim_then_close(worker: Worker) -> None:
    try:
        worker.give_slots_back()
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_a_claim_the_database_refused_gives_its_slots_back_on_the_retry():
    """A worker gives a tenant's slots back with its next claim; a claim the server
    refused (here cancelled while it waited for the tenant's row) committed nothing,
    so its retry gives them back: no slot stays counted for a run that finished."""
    tenant = TenantFactory(max_running=2)
    submit_run(tenant=tenant, kind="echo", input={"text": "a"})
    worker = Worker(WorkerOptions(listen=False, queues=["default"]))
    [run] = claims.claim(worker_id=worker.id, queues=["default"], kinds=worker.kinds, n=1, lease=60)
    gone = leave(Exit.done(result="{}").of_run(run.id, run.lease_token, give_slot=False))
    assert gone is not None and Tenant.objects.get(pk=tenant.pk).running == 1
    worker.slot_returned(tenant.pk, gone.at)

    with _connect("test holder") as holder, _connect("test canceller") as canceller:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM runs_tenant WHERE id = %s FOR UPDATE", [tenant.pk])
        claimer = threading.Thread(target=_claim_then_close, args=(worker,))
        claimer.start()

        def waiting_claims() -> list:
            return canceller.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND query LIKE '%%returns_per_tenant%%'"
            ).fetchall()

        wait_until(lambda: waiting_claims(), what="the claim to wait for the tenant's row")
        [(pid,)] = waiting_claims()
        canceller.execute("SELECT pg_cancel_backend(%s)", [pid])
        holder.execute("COMMIT")
        claimer.join(30)
    assert not claimer.is_alive()
    assert Tenant.objects.get(pk=tenant.pk).running == 0
