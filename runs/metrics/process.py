"""What this process counts: the counters and histograms of things that happen.

A run finishing, a step's duration, a lease rescued, a webhook attempt: each
is observed by the process where it happens (a worker, the reaper, the
delivery loop, a web process) in a ``prometheus_client`` registry of its
own. ``runs.metrics.publish`` writes that registry to the database, where
``GET /metrics`` sums every process's figures (``runs.metrics.scrape``).

Recording is in memory and never touches the database: a call costs a
lock and an addition, so the hot path (every claim, step and exit) pays
nothing measurable.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Seconds: a no-op step takes a millisecond, a model call tens of seconds, a tool up to the step timeout.
STEP_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
    300,
    600,
)
# Seconds: an idle fleet claims in milliseconds; a backlog makes runs wait minutes or hours.
WAIT_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    300,
    900,
    3600,
)

RUNS_FINISHED = Counter(
    "agentruns_runs_finished",
    "Runs that reached a terminal status (done, failed, cancelled).",
    ["queue", "kind", "status"],
    registry=REGISTRY,
)
QUEUE_WAIT = Histogram(
    "agentruns_queue_wait_seconds",
    "From when a run became due (submitted, retried, woken) to a worker's claim, on the database's clock.",
    ["queue", "kind"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
CLAIM_TO_START = Histogram(
    "agentruns_claim_to_start_seconds",
    "From a worker's claim to the run starting on one of its threads.",
    ["kind"],
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)
STEP_DURATION = Histogram(
    "agentruns_step_duration_seconds",
    "Steps executed (replayed steps are not), by agent kind, step kind and how they ended.",
    ["kind", "step_kind", "status"],
    buckets=STEP_BUCKETS,
    registry=REGISTRY,
)
RETRIES = Counter(
    "agentruns_retries",
    "Runs sent back to the queue to try again, by the class of the error.",
    ["kind", "error_class"],
    registry=REGISTRY,
)
LEASES_RESCUED = Counter(
    "agentruns_leases_rescued",
    "Runs of workers that stopped heartbeating, taken back by the reaper: queued again, or failed when their attempts were spent.",
    ["queue", "status"],
    registry=REGISTRY,
)
WEBHOOK_ATTEMPTS = Counter(
    "agentruns_webhook_deliveries",
    "Webhook delivery attempts by result: delivered, retry (failed, tried again later) or dead (given up).",
    ["result"],
    registry=REGISTRY,
)
SCHEDULE_FIRES = Counter(
    "agentruns_schedule_fires",
    "Fire times of schedules: fired (a run was submitted), or missed by why: catch_up (downtime "
    "the schedule's catch_up policy skipped), overlap (its previous run was live), backpressure "
    "(its tenant's queue was full) or error (its kind or input no longer submits).",
    ["outcome"],
    registry=REGISTRY,
)
SCHEDULE_LATE = Histogram(
    "agentruns_schedule_fire_late_seconds",
    "How long after its fire time a schedule's run was submitted.",
    buckets=WAIT_BUCKETS,
    registry=REGISTRY,
)


def run_finished(*, queue: str, kind: str, status: str) -> None:
    RUNS_FINISHED.labels(queue=queue, kind=kind, status=status).inc()


def claimed(*, queue: str, kind: str, waited_seconds: float) -> None:
    QUEUE_WAIT.labels(queue=queue, kind=kind).observe(max(0.0, waited_seconds))


def started(*, kind: str, after_claim_seconds: float) -> None:
    CLAIM_TO_START.labels(kind=kind).observe(max(0.0, after_claim_seconds))


def step_finished(*, kind: str, step_kind: str, status: str, seconds: float) -> None:
    STEP_DURATION.labels(kind=kind, step_kind=step_kind, status=status).observe(max(0.0, seconds))


def retried(*, kind: str, error_class: str) -> None:
    RETRIES.labels(kind=kind, error_class=error_class[:100]).inc()


def lease_rescued(*, queue: str, status: str) -> None:
    LEASES_RESCUED.labels(queue=queue, status=status).inc()


def webhook_attempt(*, result: str) -> None:
    WEBHOOK_ATTEMPTS.labels(result=result).inc()


def schedule_fired(*, outcome: str, n: int = 1) -> None:
    SCHEDULE_FIRES.labels(outcome=outcome).inc(n)


def schedule_late(seconds: float) -> None:
    SCHEDULE_LATE.observe(max(0.0, seconds))


def series() -> list[list]:
    """This process's figures as JSON rows ``[family, type, labels, bounds, values]``, one per labelled series.

    A counter's ``values`` are ``[total]``; a histogram's are its cumulative
    bucket counts, whose upper bounds ``bounds`` lists (the last ``+Inf``),
    then its sum. Compact on purpose: a scrape sums the rows of every process.
    """
    rows: list[list] = []
    for family in REGISTRY.collect():
        if family.type == "counter":
            rows.extend(
                [family.name, "counter", dict(s.labels), [], [s.value]]
                for s in family.samples
                if s.name.endswith("_total")
            )
        elif family.type == "histogram":
            grouped: dict[tuple, dict] = {}
            for sample in family.samples:
                labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
                entry = grouped.setdefault(labels, {"bounds": [], "counts": [], "sum": 0.0})
                if sample.name.endswith("_bucket"):
                    entry["bounds"].append(sample.labels["le"])
                    entry["counts"].append(sample.value)
                elif sample.name.endswith("_sum"):
                    entry["sum"] = sample.value
            rows.extend(
                [family.name, "histogram", dict(labels), e["bounds"], [*e["counts"], e["sum"]]]
                for labels, e in grouped.items()
            )
    return rows
