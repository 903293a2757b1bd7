"""Global max_running per kind and per queue (runs.engine.limits), across workers and tenants.

Real ``runworker`` processes; the test samples the database from outside.
"""

from __future__ import annotations

import time

import pytest

from runs.engine import limits
from runs.models import KindState, Queue, Run
from runs.services import submit_run
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until
from workers.reaper import Reaper

processes_db = pytest.mark.django_db(transaction=True)


def running(**where) -> int:
    return Run.objects.filter(status="running", **where).count()


@processes_db
def test_a_kind_with_max_running_2_never_runs_more_than_2_across_3_workers(processes):
    limits.set_max_running("kind", "steps", 2)
    tenants = [TenantFactory(max_running=50) for _ in range(3)]
    work = {"steps": 2, "step_seconds": 0.1}
    for tenant in tenants:
        for _ in range(6):
            submit_run(tenant=tenant, kind="steps", input=work)
        submit_run(tenant=tenant, kind="noop3", input={})  # another kind is not held back
    for _ in range(3):
        processes.worker("--concurrency", "5", "--poll", "0.1")

    samples = []

    def sample() -> bool:
        samples.append((running(kind="steps"), KindState.objects.get(name="steps").running))
        assert samples[-1][0] <= 2, samples[-1]
        assert samples[-1][1] <= 2, samples[-1]  # nor did the counter ever go past it
        return Run.objects.filter(status="done").count() == 21

    wait_until(sample, timeout=90, interval=0.05, what="every run done")
    processes.stop_all()
    print(f"\n{len(samples)} samples every 50 ms; most running at once: {max(samples)[0]}")
    assert max(s[0] for s in samples) == 2  # the limit was reached, not only never approached
    assert KindState.objects.get(name="steps").running == 0
    # The other kind ran beside the limited one, not after it.
    noop_started = max(Run.objects.filter(kind="noop3").values_list("started_at", flat=True))
    steps_finished = max(Run.objects.filter(kind="steps").values_list("finished_at", flat=True))
    assert noop_started < steps_finished


@processes_db
def test_a_queue_limit_holds_and_lifting_it_lets_the_backlog_run(processes):
    tenant = TenantFactory(max_running=50)
    limits.set_max_running("queue", "short", 1)
    runs = [
        submit_run(
            tenant=tenant, kind="steps", queue="short", input={"steps": 1, "step_seconds": 0.2}
        )
        for _ in range(4)
    ]
    processes.worker("--queues", "short", "--concurrency", "4", "--poll", "0.1")
    deadline = time.monotonic() + 1.5
    seen = []
    while time.monotonic() < deadline:
        seen.append(running(queue="short"))
        time.sleep(0.05)
    assert max(seen) == 1, seen

    limits.set_max_running("queue", "short", None)
    wait_until(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="done").count() == 4,
        what="the backlog done once the limit is lifted",
    )
    processes.stop_all()
    assert Queue.objects.get(name="short").max_running is None


@pytest.mark.django_db(transaction=True)
def test_the_reaper_sets_a_kinds_counter_to_the_truth(tenant):
    limits.set_max_running("kind", "steps", 3)
    KindState.objects.filter(name="steps").update(running=3)  # drifted: nothing is running
    report = Reaper().reap_once()
    assert report.limits_fixed == 1
    assert KindState.objects.get(name="steps").running == 0
    assert Reaper().reap_once().limits_fixed == 0


@pytest.mark.django_db(transaction=True)
def test_setlimit_sets_clears_and_refuses_what_it_cannot_mean(processes):
    out = processes.run("setlimit", "kind", "steps", "--max-running", "2")
    assert out.returncode == 0, out.stderr
    assert "kind steps: max_running 2 (0 running now)" in out.stdout
    again = processes.run("setlimit", "queue", "long", "--max-running", "5")
    assert (
        "kind steps: max_running 2" in again.stdout and "queue long: max_running 5" in again.stdout
    )
    cleared = processes.run("setlimit", "kind", "steps", "--clear")
    assert cleared.returncode == 0 and "kind steps" not in cleared.stdout
    for bad in (
        ["kind", "steps"],
        ["kind", "steps", "--max-running", "-1"],
        ["tenant", "acme", "--max-running", "1"],
        ["kind", "steps", "--max-running", "1", "--clear"],
    ):
        refused = processes.run("setlimit", *bad)
        assert refused.returncode != 0, bad
        assert refused.stderr.strip()
    assert [(x.scope, x.name, x.max_running) for x in limits.limits()] == [("queue", "long", 5)]


@pytest.mark.django_db
def test_an_operator_sets_and_changes_a_kinds_limit_in_the_admin(admin_client, tenant):
    added = admin_client.post(
        "/admin/runs/kindstate/add/", {"name": "noop3", "max_running": "2"}, follow=True
    )
    assert added.status_code == 200
    assert [(x.name, x.max_running) for x in limits.limits()] == [("noop3", 2)]
    changed = admin_client.post(
        "/admin/runs/kindstate/noop3/change/", {"max_running": "4"}, follow=True
    )
    assert changed.status_code == 200
    assert KindState.objects.get(name="noop3").max_running == 4
    page = admin_client.get("/admin/runs/kindstate/").content.decode()
    assert "noop3" in page and ">4<" in page
