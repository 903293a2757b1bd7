"""The operations overview (docs/how-to/operations.md): what is stuck, failing, using capacity, alive.

One admin page of panels; each panel polls its own htmx partial, so a
refresh runs only that panel's queries. Every query is served by an index
or reads a small table: the run table is never scanned (no count(*) over
history, only over live runs, the last hour's finished runs, and leases).
"""

from __future__ import annotations

from datetime import UTC, timedelta

from django.core.exceptions import PermissionDenied
from django.db.models import (
    Count,
    DateTimeField,
    DecimalField,
    F,
    Func,
    Min,
    OuterRef,
    Q,
    Subquery,
    Value,
)
from django.db.models.functions import Coalesce
from django.template.response import TemplateResponse
from django.utils import timezone

from runs.admin.chart import bar_chart
from runs.admin.common import money, worker_lease
from runs.models import MONEY, KindState, Queue, Run, RunStatus, Tenant, TenantDailyCost, Worker

LIVE_STATUSES = [
    RunStatus.QUEUED,
    RunStatus.RUNNING,
    RunStatus.WAITING_HUMAN,
    RunStatus.WAITING,
    RunStatus.PAUSED,
]
BUCKET = timedelta(minutes=5)
WINDOW = timedelta(hours=1)
SHOWN = 20  # rows per panel: the worst offenders, not an inventory
POLL = "every 5s"
MONEY_FIELD = DecimalField(**MONEY)


def queues_panel() -> dict:
    """Live runs by queue and status, and how long the oldest claimable run of each queue has waited."""
    now = timezone.now()
    depth: dict[str, dict] = {}
    for row in (
        Run.objects.filter(status__in=LIVE_STATUSES)
        .values("queue", "status")
        .annotate(n=Count("*"))
    ):
        depth.setdefault(row["queue"], {})[row["status"]] = row["n"]
    # run_claim_order_idx holds (queue, run_after) of queued runs: an index-only aggregate.
    oldest = dict(
        Run.objects.claimable()
        .values("queue")
        .annotate(oldest=Min("run_after"))
        .values_list("queue", "oldest")
    )
    paused = set(Queue.objects.filter(paused=True).values_list("name", flat=True))
    rows = [
        {
            "name": name,
            "paused": name in paused,
            "counts": [depth.get(name, {}).get(status, 0) for status in LIVE_STATUSES],
            "oldest_age": age(now - oldest[name]) if name in oldest else None,
        }
        for name in sorted(set(depth) | paused)
    ]
    kinds_paused = sorted(KindState.objects.filter(paused=True).values_list("name", flat=True))
    return {
        "queue_rows": rows,
        "statuses": [s.label for s in LIVE_STATUSES],
        "kinds_paused": kinds_paused,
    }


def age(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def tenants_panel() -> dict:
    """The busiest tenants: running against max_running, queued, money spent today (UTC) against the cap."""
    today = timezone.now().astimezone(UTC).date()
    spent = TenantDailyCost.objects.filter(tenant=OuterRef("pk"), day=today).values("cost_cents")[
        :1
    ]
    tenants = (
        Tenant.objects.annotate(
            cost_today=Coalesce(Subquery(spent), Value(0), output_field=MONEY_FIELD)
        )
        .filter(Q(running__gt=0) | Q(queued__gt=0) | Q(cost_today__gt=0) | Q(paused=True))
        .order_by("-running", "-cost_today", "slug")[:SHOWN]
    )
    rows = [
        {
            "tenant": t,
            "load": min(100, round(100 * t.running / t.max_running)) if t.max_running else 100,
            "cost_today": money(t.cost_today),
            "cap": money(t.daily_cost_cap_cents),
        }
        for t in tenants
    ]
    return {"tenant_rows": rows}


def throughput_panel() -> dict:
    """Runs finished in the last hour, by 5-minute bucket: done and failed, and the failure rate."""
    now = timezone.now()
    since = now - WINDOW
    bucket = Func(
        Value(BUCKET),
        F("finished_at"),
        Value(since),
        function="date_bin",
        output_field=DateTimeField(),
    )
    counts = (
        Run.objects.filter(finished_at__gte=since, status__in=[RunStatus.DONE, RunStatus.FAILED])
        .annotate(bucket=bucket)
        .values("bucket", "status")
        .annotate(n=Count("*"))
        .order_by()
    )
    slots = int(WINDOW / BUCKET)
    done, failed = [0] * slots, [0] * slots
    for row in counts:
        index = min(slots - 1, int((row["bucket"] - since) / BUCKET))
        (done if row["status"] == RunStatus.DONE else failed)[index] += row["n"]
    total_done, total_failed = sum(done), sum(failed)
    return {
        "chart": bar_chart(done, failed, since, BUCKET),
        "finished": total_done + total_failed,
        "failed": total_failed,
        "failure_rate": round(100 * total_failed / (total_done + total_failed), 1)
        if total_failed
        else 0,
    }


def stuck_panel() -> dict:
    """Running runs whose lease expired: their worker is gone and the reaper has not rescued them yet."""
    # Both queries walk run_running_idx: running runs are bounded by the tenants' max_running.
    stale = Run.objects.stale().select_related("tenant").order_by("locked_until")
    return {"stuck": list(stale[:SHOWN]), "stuck_count": stale.count()}


def workers_panel() -> dict:
    """Workers that heartbeat within a lease, and how many went silent without stopping in the last day."""
    now = timezone.now()
    alive_since = now - worker_lease()
    workers = Worker.objects.filter(stopped_at__isnull=True)
    return {
        "workers": list(workers.filter(last_seen_at__gte=alive_since).order_by("host", "pid")),
        "workers_lost": workers.filter(
            last_seen_at__lt=alive_since, last_seen_at__gte=now - timedelta(days=1)
        ).count(),
    }


PANELS = {
    "queues": queues_panel,
    "tenants": tenants_panel,
    "throughput": throughput_panel,
    "stuck": stuck_panel,
    "workers": workers_panel,
}


def overview_view(site):
    def view(request):
        if not request.user.has_perm("runs.view_run"):
            raise PermissionDenied
        panel = request.GET.get("panel")
        if panel in PANELS:
            return TemplateResponse(
                request, f"admin/runs/overview.html#{panel}", {"poll": POLL, **PANELS[panel]()}
            )
        context = {**site.each_context(request), "title": "Operations overview", "poll": POLL}
        for build in PANELS.values():
            context.update(build())
        return TemplateResponse(request, "admin/runs/overview.html", context)

    return view
