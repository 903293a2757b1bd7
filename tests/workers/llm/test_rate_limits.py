"""Rate limits shared by every worker (runs.engine.ratelimits) on a real loopback model server.

Three ``runworker`` processes at concurrency 10 call the fake provider;
its own log of requests (arrival time, tokens charged) is the judge.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.utils import timezone

from runs.engine import ratelimits
from runs.models import RateLimit, Run, Worker
from runs.services import submit_run
from tests.support.factories import TenantFactory
from tests.support.fake_openai import fail, say
from tests.support.waiting import wait_until

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm fixture
processes_db = pytest.mark.django_db(transaction=True)

USAGE = (200, 100)  # tokens the fake provider charges per call: 300


def most_in_a_minute(times: list[float]) -> int:
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t < start + 60) for i, start in enumerate(times))


@processes_db
def test_30_requests_and_20000_tokens_a_minute_hold_across_three_workers(processes, fake_llm):
    ratelimits.set_limit("llm:openai", requests_per_minute=30, tokens_per_minute=20_000)
    fake_llm.brain = lambda body: say("done", usage=USAGE)
    tenant = TenantFactory(max_running=100, max_queued=1000)
    runs = [submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "hi"}) for _ in range(40)]
    started = time.time()
    for _ in range(3):
        processes.worker("--concurrency", "10", "--poll", "0.2", **fake_llm.env)

    # The first 30 calls go out at once; the other 10 wait, queued, for the window to move on.
    wait_until(lambda: fake_llm.count >= 30, timeout=30, what="the first minute's 30 calls")
    time.sleep(2)
    assert fake_llm.count == 30
    waiting = Run.objects.filter(pk__in=[r.pk for r in runs], status="queued")
    assert waiting.count() == 10
    assert all(run.run_after.timestamp() > started + 55 for run in waiting)  # back when room frees
    # Waiting for capacity holds no worker: nothing is running.
    assert Run.objects.filter(status="running").count() == 0
    assert Worker.objects.filter(stopped_at__isnull=True).aggregate(n=Sum("runs_held"))["n"] == 0

    wait_until(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="done").count() == 40,
        timeout=90,
        what="every run done",
    )
    processes.stop_all()
    times = [request["at"] for request in fake_llm.requests]
    assert len(times) == 40
    print(
        f"\n40 model calls over {max(times) - min(times):.1f} s; most in a minute: {most_in_a_minute(times)}"
    )
    assert most_in_a_minute(times) <= 30
    assert most_in_a_minute(times) * sum(USAGE) <= 20_000
    assert Run.objects.filter(pk__in=[r.pk for r in runs], failures__gt=0).count() == 0


@processes_db
def test_a_429_with_retry_after_pauses_every_workers_calls_to_that_key(processes, fake_llm):
    ratelimits.set_limit("llm:openai", requests_per_minute=1000, tokens_per_minute=None)
    fake_llm.enqueue(fail(429, "slow down", Retry_After="5"))
    fake_llm.brain = lambda body: say("done", usage=USAGE)
    tenant = TenantFactory(max_running=100)
    runs = [submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "hi"}) for _ in range(6)]
    # One call at a time reaches the server first: the 429 lands before the others are sent.
    first = processes.worker("--concurrency", "1", "--poll", "0.2", **fake_llm.env)
    wait_until(lambda: fake_llm.count >= 1, what="the call answered 429")
    for _ in range(2):
        processes.worker("--concurrency", "10", "--poll", "0.2", **fake_llm.env)
    wait_until(
        lambda: Run.objects.filter(pk__in=[r.pk for r in runs], status="done").count() == 6,
        timeout=60,
        what="every run done",
    )
    processes.stop_all()
    assert first.poll() is not None

    refused_at = fake_llm.requests[0]["at"]
    later = [request["at"] - refused_at for request in fake_llm.requests[1:]]
    assert len(later) == 6
    assert min(later) >= 4.9, later  # no worker called the key while it was paused
    assert RateLimit.objects.get(key="llm:openai").paused_until is not None
    # Given back, not failed: nothing counted against the runs' attempts.
    assert Run.objects.filter(pk__in=[r.pk for r in runs], failures__gt=0).count() == 0


@pytest.mark.django_db(transaction=True)
def test_tokens_and_a_tenants_share_are_reserved_before_the_call(tenant):
    ratelimits.set_limit(
        "llm:p", requests_per_minute=100, tokens_per_minute=1000, per_tenant_share=0.5
    )
    other = TenantFactory()

    def reserve(who, tokens):
        return ratelimits.reserve(
            ["llm:p:m", "llm:p"], tenant_id=who.pk, run_id=None, tokens=tokens
        )

    mine = reserve(tenant, 400)
    assert isinstance(mine, ratelimits.Reserved)
    denied = reserve(tenant, 200)  # 600 > its half of 1000
    assert isinstance(denied, ratelimits.Denied) and "one tenant" in denied.why
    # While the call is in flight it may settle for less: the run looks again in a second.
    assert denied.until - timezone.now() <= timedelta(seconds=1.5)
    theirs = reserve(other, 500)  # the other half is its own
    assert isinstance(theirs, ratelimits.Reserved)
    ratelimits.settle(mine.id, tokens=400)  # both answered, using what they reserved
    ratelimits.settle(theirs.id, tokens=500)
    full = reserve(other, 200)  # 1100 > 1000 in all, and > its half
    assert isinstance(full, ratelimits.Denied)
    first = RateLimit.objects.get(key="llm:p").ratereservation_set.order_by("at").first()
    assert full.until - first.at >= timedelta(seconds=60)  # when the first one leaves the window
    with pytest.raises(ratelimits.NeverEnough):
        reserve(tenant, 600)  # more than its share allows in a whole minute
    assert (
        ratelimits.reserve(["llm:none"], tenant_id=tenant.pk, run_id=None, tokens=10**6).id is None
    )


@pytest.mark.django_db(transaction=True)
def test_setratelimit_sets_changes_clears_and_refuses(processes):
    out = processes.run(
        "setratelimit", "llm:openai", "--requests-per-minute", "30", "--tokens-per-minute", "20000"
    )
    assert out.returncode == 0, out.stderr
    assert "llm:openai: 30 requests and 20000 tokens per minute" in out.stdout
    shared = processes.run(
        "setratelimit", "llm:openai", "--requests-per-minute", "60", "--per-tenant-share", "0.25"
    )
    assert (
        "60 requests and any tokens per minute, at most 0.25 of it to one tenant" in shared.stdout
    )
    for bad in (
        ["llm:openai"],
        ["llm:openai", "--requests-per-minute", "0"],
        ["llm:openai", "--requests-per-minute", "5", "--per-tenant-share", "1.5"],
        ["llm:openai", "--clear", "--requests-per-minute", "5"],
    ):
        refused = processes.run("setratelimit", *bad)
        assert refused.returncode != 0 and refused.stderr.strip(), bad
    assert RateLimit.objects.get(key="llm:openai").requests_per_minute == 60
    cleared = processes.run("setratelimit", "llm:openai", "--clear")
    assert cleared.returncode == 0 and "no rate limits" in cleared.stdout


@pytest.mark.django_db
def test_an_operator_sets_a_rate_limit_in_the_admin(admin_client):
    added = admin_client.post(
        "/admin/runs/ratelimit/add/",
        {"key": "llm:openai", "requests_per_minute": "30", "tokens_per_minute": "20000"},
        follow=True,
    )
    assert added.status_code == 200
    limit = RateLimit.objects.get(key="llm:openai")
    assert (limit.requests_per_minute, limit.tokens_per_minute) == (30, 20_000)
    refused = admin_client.post(
        "/admin/runs/ratelimit/llm:openai/change/",
        {"requests_per_minute": "30", "per_tenant_share": "2"},
    )
    assert refused.status_code == 200 and b"errorlist" in refused.content  # shown, not saved
    assert RateLimit.objects.get(key="llm:openai").per_tenant_share is None
    assert "llm:openai" in admin_client.get("/admin/runs/ratelimit/").content.decode()
