"""Fair share between tenants (runs/sql/claim.sql, ``picked``): free slots go by weight, not by age.

Real ``runworker`` processes; the test watches the database from outside.
"""

from __future__ import annotations

import statistics
import time
from datetime import UTC, datetime

import pytest
from django.db.models import Count, Q

from runs.models import Run, Tenant
from runs.services import submit_run
from tests.support.backlog import backlog_rows
from tests.support.factories import TenantFactory
from tests.support.waiting import wait_until

processes_db = pytest.mark.django_db(transaction=True)


def running(tenant: Tenant) -> int:
    return Run.objects.filter(tenant=tenant, status="running").count()


@processes_db
def test_a_tenant_that_submits_later_is_not_starved_by_an_older_backlog(processes):
    # A may run 100 at once, more than the worker's 10 slots, and has 3,000 older runs queued.
    a = TenantFactory(max_running=100, max_queued=10_000)
    b = TenantFactory(max_running=100)
    work = {"steps": 1, "step_seconds": 0.1}
    Run.objects.bulk_create(backlog_rows(a, 3000, input=work))
    worker = processes.worker("--concurrency", "10", "--poll", "0.1")
    wait_until(lambda: running(a) == 10, what="A to fill every slot of the worker")

    for _ in range(10):
        submit_run(tenant=b, kind="steps", input=work)
    submitted = time.time()
    wait_until(
        lambda: Run.objects.filter(tenant=b, status="done").count() == 10,
        timeout=60,
        what="B's ten runs to be done",
    )
    a_left = Run.objects.filter(tenant=a, status="queued").count()
    processes.stop_all()
    assert worker.poll() is not None

    # The first claim that began after B's runs were committed took one of them:
    # B waited one claim round, not behind A's backlog.
    rounds = sorted(
        {
            claimed_at
            for claimed_at in Run.objects.filter(claimed_at__gt=_aware(submitted)).values_list(
                "claimed_at", flat=True
            )
        }
    )
    first_round = Run.objects.filter(claimed_at=rounds[0])
    assert first_round.filter(tenant=b).exists(), list(first_round.values_list("tenant__slug"))

    b_done = Run.objects.filter(tenant=b).order_by("started_at")
    waits = [(r.started_at - r.created_at).total_seconds() for r in b_done]
    print(
        f"\nB's waits from submit to start (s): first {waits[0]:.3f}, median "
        f"{statistics.median(waits):.3f}, last {waits[-1]:.3f}; A still queued: {a_left} of 3000"
    )
    # B's ten finished long before A's backlog: almost all of it was still queued.
    assert a_left > 2500
    # Each of B's runs started within a few of A's 0.1 s runs, not behind thousands of them.
    assert max(waits) < 5


@processes_db
def test_the_running_share_follows_the_tenants_weights(processes):
    heavy = TenantFactory(max_running=100, max_queued=10_000, weight=3)
    light = TenantFactory(max_running=100, max_queued=10_000, weight=1)
    work = {"steps": 1, "step_seconds": 0.2}
    # The light tenant's backlog is older: by age alone it would take every slot.
    Run.objects.bulk_create(backlog_rows(light, 600, input=work))
    Run.objects.bulk_create(backlog_rows(heavy, 600, input=work))
    processes.worker("--concurrency", "8", "--poll", "0.1")
    wait_until(
        lambda: Run.objects.filter(status="done").count() >= 40,
        timeout=60,
        what="the worker to be busy for a while",
    )

    samples = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        counts = Run.objects.aggregate(
            heavy=Count("pk", filter=Q(tenant=heavy, status="running")),
            light=Count("pk", filter=Q(tenant=light, status="running")),
        )
        if counts["heavy"] + counts["light"]:
            samples.append(counts)
        time.sleep(0.05)
    processes.stop_all()

    heavy_share = sum(s["heavy"] for s in samples) / sum(s["heavy"] + s["light"] for s in samples)
    print(f"\nweights 3:1 over {len(samples)} samples: the heavy tenant ran {heavy_share:.0%}")
    assert 0.65 <= heavy_share <= 0.85, samples
    # The light tenant was not shut out (a sample may fall between one of its runs and the next).
    assert sum(1 for s in samples if s["light"] == 0) <= len(samples) // 10, samples


def _aware(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)
