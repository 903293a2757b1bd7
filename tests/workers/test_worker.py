import pytest

from runs.services import submit_run
from tests.conftest import fresh
from workers.worker import Worker, WorkerOptions


@pytest.mark.django_db(transaction=True)
def test_burst_worker_in_process_finishes_a_run(tenant):
    run = submit_run(tenant=tenant, kind="echo", input={"text": "hi", "times": 2})
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()
    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"echo": "hihi"}
    assert run.steps_done == 1
