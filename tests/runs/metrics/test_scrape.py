"""GET /metrics: scraped after real worker, reaper and delivery processes did real work, parsed with
prometheus_client's own parser, and compared with what the database says happened."""

from __future__ import annotations

import signal
from decimal import Decimal

import pytest
from django.db import transaction
from django.db.models import Sum
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from runs.control import cancel_run
from runs.events import Actor
from runs.metrics import process
from runs.metrics.publish import Publisher, keyed, retire_silent
from runs.models import (
    MetricSnapshot,
    Run,
    Step,
    StepAttempt,
    TenantDailyCost,
    WebhookDelivery,
    Worker,
)
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.agents import executions
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "scrape-token-1d0c2f"
FAST = {"RUNS_METRICS_PUBLISH_SECONDS": "0.2"}


@pytest.fixture
def metrics_on(settings):
    settings.RUNS_METRICS_TOKEN = TOKEN
    return settings


def scrape() -> dict[str, dict[tuple, float]]:
    """Every sample of GET /metrics: {sample name: {sorted label pairs: value}}."""
    response = Client().get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        assert family.name.startswith("agentruns_"), family.name
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def total(samples: dict, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(
        value for key, value in samples.get(name, {}).items() if set(labels.items()) <= set(key)
    )


def test_metrics_do_not_exist_without_a_token_and_refuse_a_wrong_one(settings, client):
    settings.RUNS_METRICS_TOKEN = ""
    assert client.get("/metrics", headers={"Authorization": "Bearer anything"}).status_code == 404
    settings.RUNS_METRICS_TOKEN = TOKEN
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": "Bearer \u00e9\u0000"},
    ):
        response = client.get("/metrics", headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["detail"].startswith("send the metrics token")
        assert response["WWW-Authenticate"].startswith("Bearer")
    assert client.post("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 405
    assert client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_after_real_work_the_scrape_agrees_with_the_database(
    tenant, processes, metrics_on, tmp_path
):
    log = str(tmp_path / "exec.log")
    for _ in range(4):
        submit_run(tenant=tenant, kind="steps", input={"steps": 3, "log": log})
    flaky = [
        submit_run(tenant=tenant, kind="flaky_call", input={"fail_times": 1}) for _ in range(2)
    ]
    submit_run(tenant=tenant, kind="broken", input={})
    submit_run(tenant=tenant, kind="spender", input={"steps": 2, "cents": 5})
    waiting = submit_run(tenant=tenant, kind="approve_then_act", input={})
    for text in ("a", "b"):
        submit_run(
            tenant=tenant, kind="echo", input={"text": text}, queue="long"
        )  # no worker serves "long"

    worker = processes.worker("--queues", "default", "--poll", "0.1", **FAST)
    wait_until(
        lambda: (
            Run.objects.filter(queue="default", status__in=["done", "failed"]).count() == 8
            and fresh(waiting).status == "waiting_human"
        ),
        timeout=60,
        what="the default queue to drain",
    )
    wait_until(
        lambda: total(scrape(), "agentruns_runs_finished_total") == 8,
        timeout=10,
        what="the worker to publish its counts",
    )
    live = scrape()
    assert total(live, "agentruns_workers_live") == 1
    assert total(live, "agentruns_metrics_processes", role="worker") == 1
    assert (
        total(live, "agentruns_worker_slots")
        == Worker.objects.get(stopped_at__isnull=True).concurrency
    )

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0, processes.output(worker)
    samples = scrape()

    # Live runs, by queue and status, exactly.
    assert total(samples, "agentruns_runs", queue="long", status="queued") == 2
    assert total(samples, "agentruns_runs", queue="default", status="waiting_human") == 1
    assert total(samples, "agentruns_runs", queue="default", status="queued") == 0
    assert total(samples, "agentruns_queue_oldest_age_seconds", queue="long") > 0
    assert total(samples, "agentruns_tenant_queued", tenant=tenant.slug) == 2
    assert total(samples, "agentruns_workers_live") == 0

    # Finished runs, by kind and status, as the worker counted them.
    for kind in ("steps", "flaky_call", "spender", "broken"):
        for status in ("done", "failed"):
            expected = Run.objects.filter(kind=kind, status=status).count()
            assert (
                total(samples, "agentruns_runs_finished_total", kind=kind, status=status)
                == expected
            ), (kind, status)
    assert total(samples, "agentruns_runs_finished_total", status="done") == 7

    # Each claim waited in the queue once; each failed try was a retry, named by its error's class.
    attempts = sum(run.attempt for run in Run.objects.filter(kind="steps"))
    assert total(samples, "agentruns_queue_wait_seconds_count", kind="steps") == attempts == 4
    assert total(samples, "agentruns_claim_to_start_seconds_count", kind="steps") == 4
    assert (
        total(samples, "agentruns_retries_total", kind="flaky_call")
        == sum(fresh(r).attempt - 1 for r in flaky)
        == 2
    )
    assert (
        total(samples, "agentruns_retries_total", kind="flaky_call", error_class="Retryable") == 2
    )

    # Steps executed, by how they ended: one observation per execution.
    assert (
        total(samples, "agentruns_step_duration_seconds_count", kind="steps", status="done")
        == (Step.objects.filter(run__kind="steps", status="done").count())
        == len(executions(log))
        == 12
    )
    assert (
        total(samples, "agentruns_step_duration_seconds_count", kind="flaky_call", status="failed")
        == (StepAttempt.objects.filter(run__kind="flaky_call").count())
        == 2
    )
    assert (
        total(samples, "agentruns_step_duration_seconds_count", kind="broken", status="failed") == 1
    )

    # Money: what the tenant spent, all days and today.
    spent = TenantDailyCost.objects.filter(tenant=tenant).aggregate(s=Sum("cost_cents"))["s"]
    assert spent == Decimal(10) + Decimal(
        2
    )  # the spender's two calls, and flaky_call's call that succeeded
    assert total(samples, "agentruns_cost_cents_total", tenant=tenant.slug) == float(spent)
    assert total(samples, "agentruns_tenant_cost_today_cents", tenant=tenant.slug) == float(spent)


def test_histogram_buckets_are_cumulative_and_end_in_the_count(tenant, processes, metrics_on):
    for n in range(3):
        submit_run(tenant=tenant, kind="noop3", input={"n": n})
    worker = processes.worker("--burst", **FAST)
    assert worker.wait(60) == 0, processes.output(worker)
    samples = scrape()
    labels = (("kind", "noop3"), ("status", "done"), ("step_kind", "custom"))
    buckets = sorted(
        (float(dict(key)["le"]), value)
        for key, value in samples["agentruns_step_duration_seconds_bucket"].items()
        if set(labels) <= set(key)
    )
    values = [value for _, value in buckets]
    assert values == sorted(values), "buckets must not decrease"
    assert buckets[-1] == (float("inf"), 9)
    assert samples["agentruns_step_duration_seconds_count"][labels] == 9


def test_a_rescued_lease_is_counted_by_the_reaper(tenant, processes, metrics_on, tmp_path):
    log = str(tmp_path / "exec.log")
    block = tmp_path / "block"
    block.touch()
    run = submit_run(
        tenant=tenant,
        kind="steps",
        input={"steps": 2, "log": log, "block_at": 2, "block_file": str(block)},
    )
    worker = processes.worker("--lease", "2", "--heartbeat", "0.5", "--poll", "0.1", **FAST)
    wait_until(lambda: len(executions(log)) == 2, what="step 2 to start")
    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once", **FAST)
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr

    samples = scrape()
    assert total(samples, "agentruns_leases_rescued_total", queue="default", status="queued") == 1
    assert total(samples, "agentruns_retries_total", kind="steps", error_class="LeaseExpired") == 1
    assert total(samples, "agentruns_metrics_processes", role="reaper") == 1
    assert total(samples, "agentruns_runs", queue="default", status="queued") == 1


def test_webhook_attempts_are_counted_by_result(tenant, processes, metrics_on, settings):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    receiver = Receiver()
    receiver.answer(500)  # the first attempt fails and is tried again
    try:
        run = submit_run(
            tenant=tenant, kind="echo", input={"text": "hook"}, callback_url=receiver.url
        )
        worker = processes.worker("--burst", **FAST)
        assert worker.wait(60) == 0, processes.output(worker)
        loop = processes.manage(
            "deliverwebhooks",
            "--poll",
            "0.2",
            RUNS_WEBHOOKS_ALLOW_PRIVATE="1",
            RUNS_WEBHOOK_RETRY_SCHEDULE="0.2",
            **FAST,
        )
        receiver.wait_for(2, timeout=30)
        wait_until(
            lambda: WebhookDelivery.objects.filter(run=run, status="delivered").exists(),
            what="delivery",
        )
        loop.send_signal(signal.SIGTERM)
        assert loop.wait(30) == 0, processes.output(loop)
    finally:
        receiver.server.shutdown()
    samples = scrape()
    assert total(samples, "agentruns_webhook_deliveries_total", result="retry") == 1
    assert total(samples, "agentruns_webhook_deliveries_total", result="delivered") == 1
    assert total(samples, "agentruns_webhook_deliveries_live") == 0


def test_a_cancel_counts_once_it_commits(tenant, metrics_on):
    run = submit_run(tenant=tenant, kind="echo", input={"text": "never"})
    key = (
        "agentruns_runs_finished",
        "counter",
        (("kind", "echo"), ("queue", "default"), ("status", "cancelled")),
        (),
    )
    before = keyed(process.series()).get(key, [0])[0]
    with pytest.raises(RuntimeError), transaction.atomic():
        cancel_run(run=run, actor=Actor(type="system"))
        raise RuntimeError("rolled back")
    assert fresh(run).status == "queued"
    assert keyed(process.series()).get(key, [0])[0] == before
    cancel_run(run=run, actor=Actor(type="system"))
    assert keyed(process.series())[key] == [before + 1]


def test_counts_survive_a_restart_and_folding_without_counting_twice(metrics_on):
    """A process's row, folded into RETIRED while it was silent, is not counted again when it comes back."""
    key = ("agentruns_leases_rescued", "counter", (("queue", "fold"), ("status", "queued")), ())
    own = keyed(process.series()).get(key, [0])[0]
    first = Publisher(role="worker")
    process.lease_rescued(queue="fold", status="queued")
    first.publish()
    assert total(scrape(), "agentruns_leases_rescued_total", queue="fold") == own + 1

    assert retire_silent(silent_seconds=0) == 1  # silent "long enough": folded
    assert list(MetricSnapshot.objects.values_list("process", flat=True)) == [
        MetricSnapshot.RETIRED
    ]
    assert total(scrape(), "agentruns_leases_rescued_total", queue="fold") == own + 1

    process.lease_rescued(queue="fold", status="queued")
    first.publish()  # finds its row gone: a new row with what it counted since
    assert MetricSnapshot.objects.count() == 2
    assert total(scrape(), "agentruns_leases_rescued_total", queue="fold") == own + 2
    assert retire_silent(silent_seconds=0) == 1
    assert total(scrape(), "agentruns_leases_rescued_total", queue="fold") == own + 2


def test_a_scrape_reads_a_fixed_number_of_queries_whatever_the_number_of_runs(
    tenant, metrics_on, django_assert_num_queries
):
    for n in range(30):
        submit_run(tenant=tenant, kind="echo", input={"text": f"run {n}"})
    client = Client()
    with django_assert_num_queries(8):
        response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
