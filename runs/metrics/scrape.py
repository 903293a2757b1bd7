"""``GET /metrics``: the state read from the database at scrape time, plus every process's published figures.

Two sources, each the natural one for what it measures:

- state (runs waiting in each queue, the oldest one's age, live workers,
  tenants' load, money spent, deliveries pending) is read from the tables
  when scraped, every query bounded by a partial index of live rows or a
  small table. The run table itself is never counted: its size comes from
  the planner's estimate, so a scrape costs the same at a million runs as at
  a hundred;
- what happens (runs finishing, steps and their durations, retries,
  rescues, webhook attempts) is counted where it happens and published by
  each process (``runs.metrics.publish``); the scrape sums the rows.

The statements are in ``runs/sql/scrape.sql``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from decimal import Decimal

from django.conf import settings
from django.db import connection
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from runs.db import loads
from runs.metrics.process import REGISTRY
from runs.metrics.publish import keyed, summed
from runs.queries import queries, rows, single
from runs.states import LIVE_STATUSES, RunStatus

# Counted exactly up to this many; past it the figure says "at least this many".
DELIVERIES_COUNTED_UP_TO = 100_000
ESTIMATED_TABLES = ("runs_run", "runs_step", "runs_event", "runs_webhookdelivery")
LIVE = [s for s in RunStatus if s in LIVE_STATUSES]


class DatabaseCollector:
    """A ``prometheus_client`` collector that reads the database on every ``collect()``."""

    def collect(self) -> Iterator[Metric]:
        with connection.cursor() as cursor:
            yield from self._runs(cursor)
            yield from self._workers(cursor)
            yield from self._tenants(cursor)
            yield from self._deliveries(cursor)
            yield from self._estimates(cursor)
            yield from self._published(cursor)

    def _runs(self, cursor) -> Iterable[Metric]:
        runs = GaugeMetricFamily(
            "agentruns_runs",
            "Live runs by queue and status (finished runs: agentruns_runs_finished_total).",
            labels=["queue", "status"],
        )
        cursor.execute(queries.live_runs)
        counts = {(row["queue"], row["status"]): row["n"] for row in rows(cursor)}
        cursor.execute(queries.oldest_queued)
        oldest = {row["queue"]: row["age"] for row in rows(cursor)}
        queues = sorted({queue for queue, _ in counts} | set(oldest) | set(settings.RUNS_QUEUES))
        for queue in queues:
            for status in LIVE:
                runs.add_metric([queue, status], counts.get((queue, status), 0))
        yield runs
        age = GaugeMetricFamily(
            "agentruns_queue_oldest_age_seconds",
            "How long the oldest claimable run of each queue has waited (0: none waiting).",
            labels=["queue"],
        )
        for queue in queues:
            age.add_metric([queue], max(0.0, float(oldest.get(queue, 0))))
        yield age

    def _workers(self, cursor) -> Iterable[Metric]:
        cursor.execute(queries.live_workers, {"lease": settings.RUNS_LEASE_SECONDS})
        workers = single(cursor)
        live, held, slots = workers["live"], workers["held"], workers["slots"]
        yield GaugeMetricFamily(
            "agentruns_workers_live",
            "Worker processes registered, not stopped, seen within a lease.",
            value=live,
        )
        yield GaugeMetricFamily(
            "agentruns_worker_runs_held",
            "Runs the live workers hold, as of their last heartbeat.",
            value=held,
        )
        yield GaugeMetricFamily(
            "agentruns_worker_slots",
            "Runs the live workers may hold at once (their concurrency).",
            value=slots,
        )

    def _tenants(self, cursor) -> Iterable[Metric]:
        running = GaugeMetricFamily(
            "agentruns_tenant_running",
            "Runs running per tenant (tenants with live runs).",
            labels=["tenant"],
        )
        limit = GaugeMetricFamily(
            "agentruns_tenant_max_running",
            "The tenant's limit of runs running at once.",
            labels=["tenant"],
        )
        queued = GaugeMetricFamily(
            "agentruns_tenant_queued",
            "Runs queued per tenant (the backpressure counter).",
            labels=["tenant"],
        )
        cursor.execute(queries.busy_tenants)
        for row in rows(cursor):
            running.add_metric([row["slug"]], row["running"])
            queued.add_metric([row["slug"]], row["queued"])
            limit.add_metric([row["slug"]], row["max_running"])
        yield from (running, limit, queued)
        total = CounterMetricFamily(
            "agentruns_cost_cents",
            "Money spent by each tenant's runs, in cents (model calls and tools).",
            labels=["tenant"],
        )
        today = GaugeMetricFamily(
            "agentruns_tenant_cost_today_cents",
            "Money spent by each tenant today (UTC), in cents: what its daily cap counts.",
            labels=["tenant"],
        )
        cursor.execute(queries.tenant_costs)
        for row in rows(cursor):
            total.add_metric([row["slug"]], float(row["cents"] or Decimal(0)))
            today.add_metric([row["slug"]], float(row["cents_today"] or Decimal(0)))
        yield from (total, today)

    def _deliveries(self, cursor) -> Iterable[Metric]:
        pending = GaugeMetricFamily(
            "agentruns_webhook_deliveries_live",
            f"Webhook deliveries not yet delivered or given up, by status (counted up to {DELIVERIES_COUNTED_UP_TO}).",
            labels=["status"],
        )
        cursor.execute(queries.live_deliveries_by_status, {"up_to": DELIVERIES_COUNTED_UP_TO})
        counts = {row["status"]: row["n"] for row in rows(cursor)}
        for status in ("pending", "sending"):
            pending.add_metric([status], counts.get(status, 0))
        yield pending

    def _estimates(self, cursor) -> Iterable[Metric]:
        estimated = GaugeMetricFamily(
            "agentruns_table_rows_estimated",
            "Rows in the largest tables, as the planner estimates them (retention keeps them bounded).",
            labels=["table"],
        )
        cursor.execute(queries.table_estimates, {"tables": list(ESTIMATED_TABLES)})
        for row in rows(cursor):
            estimated.add_metric(
                [row["name"]], max(0.0, float(row["estimate"]))
            )  # -1: never analysed
        yield estimated

    def _published(self, cursor) -> Iterable[Metric]:
        cursor.execute(
            queries.metric_snapshots, {"recent": 3 * settings.RUNS_METRICS_PUBLISH_SECONDS}
        )
        total: dict = {}
        reporting: dict[str, int] = {}
        for row in rows(cursor):
            total = summed(total, keyed(loads(row["samples"])))
            if row["recent"] and row["role"] != "retired":
                reporting[row["role"]] = reporting.get(row["role"], 0) + 1
        processes = GaugeMetricFamily(
            "agentruns_metrics_processes",
            "Processes that published their figures recently, by role.",
            labels=["role"],
        )
        for role in ("worker", "reaper", "webhooks", "web"):
            processes.add_metric([role], reporting.get(role, 0))
        yield processes
        yield from summed_families(total)


@functools.cache
def help_texts() -> dict[str, str]:
    """Each family's help text, as this code defines it (fixed: read once, not at every scrape)."""
    return {family.name: family.documentation for family in REGISTRY.collect()}


def summed_families(total: dict) -> Iterator[Metric]:
    """Metric families of the summed series, each with this code's help text."""
    helps = help_texts()
    families: dict[tuple[str, str], list] = {}
    for (family, kind, labels, bounds), values in total.items():
        families.setdefault((family, kind), []).append((labels, bounds, values))
    for (family, kind), series in sorted(families.items()):
        metric = Metric(family, helps.get(family, family), kind)
        for labels, bounds, values in sorted(series):
            if kind == "counter":
                metric.add_sample(f"{family}_total", dict(labels), values[0])
            elif kind == "histogram":
                for bound, count in zip(bounds, values, strict=False):
                    metric.add_sample(f"{family}_bucket", {**dict(labels), "le": bound}, count)
                metric.add_sample(f"{family}_count", dict(labels), values[len(bounds) - 1])
                metric.add_sample(f"{family}_sum", dict(labels), values[-1])
        yield metric


def render() -> bytes:
    """The Prometheus text exposition of everything above."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector())
    return generate_latest(registry)
