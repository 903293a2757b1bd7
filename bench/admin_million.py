"""Operations console benchmark: the admin's pages over a million runs (issue 7).

    .venv/bin/python bench/admin_million.py                 # 1,000,000 runs (about two minutes to fill)
    .venv/bin/python bench/admin_million.py --runs 200000   # smaller
    .venv/bin/python bench/admin_million.py --explain       # also print the plans of the pages' queries
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/admin_million.py

Like bench/engine.py it uses DATABASE_URL or the embedded PostgreSQL and
works in a database ``bench_<pid>`` of its own, dropped at the end.

The fill is raw ``INSERT ... SELECT generate_series`` (every NOT NULL column
without a database default gets its model default, like submit_run's rows):
runs spread over 30 days across 20 tenants, three kinds and three queues,
mostly done, with failed, cancelled, queued, waiting, paused and running
runs (a few of them with an expired lease); 3 steps for every 10th run;
events for every run (2, or 5 with steps); workers alive, dead and stopped;
today's spend per tenant. Then VACUUM ANALYZE, as autovacuum would have.

Each page is requested through Django's test Client as a logged-in
superuser, in this process (no network, no web server): two warm-up
requests, then p50 and max of ``--repeat`` timed ones, with the number of
SQL queries. The target: every page under 500 ms. Then two bulk actions
on "select all" of a filtered list (cancel, retry), through the admin.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, pct, say, sql  # noqa: E402

TARGET_MS = 500.0
TENANTS = 20
KINDS = ["bench_noop", "bench_probe", "bench_steps"]  # registered by bench.agents
QUEUES = ["default", "short", "long"]
SPACING_S = 30 * 24 * 3600  # runs are spread over 30 days, the newest now


def insert_select(model, rows: dict[str, str], source: str, params: dict) -> None:
    """INSERT INTO <model> (...) SELECT <rows> FROM <source>; other NOT NULL columns get the model default."""
    from django.db import connection

    params = dict(params)
    for field in model._meta.concrete_fields:
        if field.column in rows or field.null or field.has_db_default() or field.db_returning:
            continue
        if not field.has_default():
            raise RuntimeError(
                f"{model._meta.db_table}.{field.column} has no default: give it a value"
            )
        params[f"d_{field.column}"] = field.get_db_prep_save(field.get_default(), connection)
        rows[field.column] = f"%(d_{field.column})s"
    sql(
        f"INSERT INTO {model._meta.db_table} ({', '.join(rows)}) SELECT {', '.join(rows.values())} FROM {source}",
        params,
    )


# g = 1..n; the newest run is g = n. r spreads statuses evenly over time.
RUN_SOURCE = """(
    SELECT g, (g::bigint * 7919) %% 1000 AS r,
           statement_timestamp() - make_interval(secs => (%(n)s - g) * %(spacing)s) AS created,
           CASE
             WHEN g %% 5000 = 0 THEN 'running'
             WHEN (g::bigint * 7919) %% 1000 < 880 THEN 'done'
             WHEN (g::bigint * 7919) %% 1000 < 940 THEN 'failed'
             WHEN (g::bigint * 7919) %% 1000 < 950 THEN 'cancelled'
             WHEN (g::bigint * 7919) %% 1000 < 970 THEN 'queued'
             WHEN (g::bigint * 7919) %% 1000 < 975 THEN 'waiting_human'
             WHEN (g::bigint * 7919) %% 1000 < 978 THEN 'waiting'
             WHEN (g::bigint * 7919) %% 1000 < 980 THEN 'paused'
             ELSE 'done'
           END AS status
    FROM generate_series(1, %(n)s) AS g
) s"""

RUN_ROWS = {
    "id": "gen_random_uuid()",
    "tenant_id": "(%(tenants)s::uuid[])[1 + g %% %(n_tenants)s]",
    "kind": "(%(kinds)s::text[])[1 + (g / 7) %% 3]",
    "queue": "(%(queues)s::text[])[1 + (g / 11) %% 3]",
    "priority": "g %% 10",
    "input": "jsonb_build_object('n', g, 'text', 'summarise the quarterly report for customer ' || g)",
    "status": "status",
    "attempt": "CASE WHEN status = 'queued' THEN 0 ELSE 1 END",
    "lease_token": "CASE WHEN status = 'running' THEN g END",
    "locked_by": "CASE WHEN status = 'running' THEN %(worker)s::uuid END",
    # Every tenth running run has a lease that expired a minute ago: stuck.
    "locked_until": "CASE WHEN status = 'running' THEN statement_timestamp()"
    " + CASE WHEN g %% 50000 = 0 THEN interval '-1 minute' ELSE interval '5 minutes' END END",
    "claimed_at": "CASE WHEN status = 'running' THEN statement_timestamp() - interval '90 seconds' END",
    "heartbeat_at": "CASE WHEN status = 'running' THEN statement_timestamp() - interval '10 seconds' END",
    "run_after": "created",
    "running_seconds": "CASE WHEN status = 'queued' THEN 0 ELSE 4 END",
    "expires_at": "created + interval '7 days'",
    "result": "CASE WHEN status = 'done' THEN jsonb_build_object('summary', repeat('ok ', 30)) END",
    "error": "CASE WHEN status = 'failed' THEN 'the CRM answered 422: field email is invalid' ELSE '' END",
    "error_kind": "CASE WHEN status = 'failed' THEN"
    " (ARRAY['retryable','fatal','ambiguous','deadline','budget'])[1 + (g / 20) %% 5] ELSE '' END",
    "idempotency_key": "CASE WHEN g %% 3 = 0 THEN 'order-' || g END",
    "request_hash": "md5(g::text)",
    "cost_cents": "(g %% 100) / 10.0",
    "last_event_seq": "CASE WHEN g %% 10 = 0 THEN 5 ELSE 2 END",
    "steps_done": "CASE WHEN g %% 10 = 0 AND status <> 'queued' THEN 3 ELSE 0 END",
    "started_at": "CASE WHEN status <> 'queued' THEN created + interval '1 second' END",
    "finished_at": "CASE WHEN status IN ('done', 'failed', 'cancelled') THEN created + interval '5 seconds' END",
    "created_at": "created",
    "updated_at": "created + interval '5 seconds'",
}


def fill(n: int) -> dict:
    """The million runs and everything around them; returns a few ids for the pages."""
    import uuid

    from runs.models import Event, Run, Step, Tenant, TenantDailyCost, Worker

    tenants = [
        Tenant.objects.create(
            name=f"Tenant {i}",
            slug=f"tenant-{i:02d}",
            max_running=20,
            max_queued=1_000_000,
            daily_cost_cap_cents=50_000 if i % 5 == 0 else None,
        )
        for i in range(TENANTS)
    ]
    worker = uuid.uuid4()
    started = time.perf_counter()
    insert_select(
        Run,
        dict(RUN_ROWS),
        RUN_SOURCE,
        {
            "n": n,
            "spacing": SPACING_S / n,
            "tenants": [t.pk for t in tenants],
            "n_tenants": TENANTS,
            "kinds": KINDS,
            "queues": QUEUES,
            "worker": worker,
        },
    )
    say(f"  runs      {n:>10,} in {time.perf_counter() - started:5.1f} s")

    started = time.perf_counter()
    steps_of = "runs_run r CROSS JOIN generate_series(1, 3) AS s(seq) WHERE r.last_event_seq = 5"
    insert_select(
        Step,
        {
            "run_id": "r.id",
            "seq": "s.seq",
            "name": "'step-' || s.seq",
            "kind": "(ARRAY['llm','tool','llm'])[s.seq]",
            "input": "jsonb_build_object('prompt', repeat('context ', 20))",
            "output": "CASE WHEN r.status = 'queued' THEN NULL ELSE jsonb_build_object('text', repeat('answer ', 20)) END",
            "tokens_in": "1200",
            "tokens_out": "300",
            "cost_cents": "0.42",
            "status": "CASE WHEN r.status = 'queued' THEN 'running' ELSE 'done' END",
            "executions": "1",
            "started_at": "r.started_at",
            "ended_at": "r.finished_at",
        },
        steps_of,
        {},
    )
    steps = sql("SELECT count(*) FROM runs_step")[0][0]
    say(f"  steps     {steps:>10,} in {time.perf_counter() - started:5.1f} s")

    started = time.perf_counter()
    insert_select(
        Event,
        {
            "run_id": "r.id",
            "seq": "e.seq",
            "type": "CASE WHEN e.seq = 1 THEN 'run.submitted' WHEN e.seq = r.last_event_seq THEN 'run.' || r.status"
            " ELSE 'step.done' END",
            "actor_type": "CASE WHEN e.seq = 1 THEN 'api_key' ELSE 'worker' END",
            "payload": "jsonb_build_object('seq', e.seq)",
            "created_at": "r.created_at + make_interval(secs => e.seq)",
        },
        "runs_run r CROSS JOIN LATERAL generate_series(1, r.last_event_seq) AS e(seq)",
        {},
    )
    events = sql("SELECT count(*) FROM runs_event")[0][0]
    say(f"  events    {events:>10,} in {time.perf_counter() - started:5.1f} s")

    # What the claim and the checkpoints would have kept: counters and today's spend.
    sql(
        "UPDATE runs_tenant t SET running = c.running, queued = c.queued FROM ("
        " SELECT tenant_id, count(*) FILTER (WHERE status = 'running') AS running,"
        " count(*) FILTER (WHERE status = 'queued') AS queued FROM runs_run GROUP BY tenant_id) c"
        " WHERE c.tenant_id = t.id"
    )
    from django.utils import timezone

    today = timezone.now().date()
    TenantDailyCost.objects.bulk_create(
        [
            TenantDailyCost(tenant=t, day=today, cost_cents=1000 + 37 * i)
            for i, t in enumerate(tenants)
        ]
    )
    now = timezone.now()
    from datetime import timedelta

    Worker.objects.bulk_create(
        [
            Worker(
                id=worker,
                host="bench-1",
                pid=1,
                queues=QUEUES,
                kinds=KINDS,
                concurrency=50,
                runs_held=40,
            )
        ]
        + [
            Worker(
                host=f"bench-{i}", pid=i, queues=QUEUES, kinds=KINDS, concurrency=50, runs_held=40
            )
            for i in range(2, 5)
        ]
        + [
            Worker(
                host="bench-dead",
                pid=i,
                queues=QUEUES,
                kinds=KINDS,
                concurrency=50,
                runs_held=3,
                last_seen_at=now - timedelta(hours=1),
            )
            for i in range(3)
        ]
        + [
            Worker(
                host="bench-old",
                pid=i,
                queues=QUEUES,
                kinds=KINDS,
                concurrency=50,
                last_seen_at=now - timedelta(days=2),
                stopped_at=now - timedelta(days=2),
            )
            for i in range(10)
        ]
    )
    started = time.perf_counter()
    for table in (
        "runs_run",
        "runs_step",
        "runs_event",
        "runs_tenant",
        "runs_tenantdailycost",
        "runs_worker",
    ):
        sql(f"VACUUM ANALYZE {table}")
    say(f"  VACUUM ANALYZE in {time.perf_counter() - started:5.1f} s")
    with_steps = (
        Run.objects.filter(status="failed", last_event_seq=5)
        .order_by("-created_at")
        .values_list("id", flat=True)
        .first()
    )
    key = (
        Run.objects.filter(idempotency_key__isnull=False)
        .order_by("created_at")
        .values_list("idempotency_key", flat=True)
        .first()
    )
    return {"run_with_steps": with_steps, "idempotency_key": key}


def publish_fleet(processes: int) -> str:
    """Rows of ``processes`` workers' figures (three kinds, every step kind, retries); returns a metrics token."""
    import uuid

    from django.conf import settings

    from runs.metrics import process
    from runs.metrics.publish import Publisher
    from runs.states import StepKind

    for n in range(200):
        kind = KINDS[n % len(KINDS)]
        process.claimed(queue=QUEUES[n % len(QUEUES)], kind=kind, waited_seconds=n / 1000)
        process.started(kind=kind, after_claim_seconds=n / 10000)
        process.run_finished(
            queue=QUEUES[n % len(QUEUES)], kind=kind, status=("done", "failed", "cancelled")[n % 3]
        )
        for step_kind in StepKind.values:
            process.step_finished(
                kind=kind, step_kind=step_kind, status="done" if n % 7 else "failed", seconds=n / 50
            )
        process.retried(kind=kind, error_class=("Retryable", "HTTPError", "TimeoutError")[n % 3])
    for _ in range(processes):
        publisher = Publisher(role="worker")
        publisher.process = uuid.uuid4()
        publisher.publish()
    settings.RUNS_METRICS_TOKEN = "bench-metrics-token"
    return settings.RUNS_METRICS_TOKEN


def measure(client, label: str, url: str, *, repeat: int, headers: dict | None = None) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    headers = headers or {}
    for _ in range(2):
        response = client.get(url, headers=headers)
        if response.status_code != 200:
            raise RuntimeError(f"{label}: GET {url} answered {response.status_code}")
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(url, headers=headers)
        times.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as queries:
        client.get(url, headers=headers)
    return {
        "label": label,
        "url": url,
        "p50": pct(times, 50),
        "max": max(times),
        "queries": len(queries),
        "sql": [q["sql"] for q in queries.captured_queries],
    }


def explain(sql_text: str) -> str:
    rows = sql("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql_text)
    return "\n".join("      " + row[0] for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN ANALYZE of each page's slowest query"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    db = Database(agent_modules="bench.agents")
    try:
        db.setup()
        say(
            f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL'} · {db.version.split(',')[0]}"
        )
        say(f"database   : {db.name} (dropped at the end)")
        say(f"fill       : {args.runs:,} runs")
        ids = fill(args.runs)

        from django.contrib.auth import get_user_model
        from django.test import Client

        admin = get_user_model().objects.create_superuser(
            "bench-admin", "admin@example.com", "bench-pass"
        )
        client = Client()
        client.force_login(admin)
        run_url = f"/admin/runs/run/{ids['run_with_steps']}/change/"
        pages = [
            ("run changelist", "/admin/runs/run/", {}),
            ("filtered changelist", f"/admin/runs/run/?status__exact=failed&kind={KINDS[2]}", {}),
            ("run change page", run_url, {}),
            ("overview", "/admin/runs/run/overview/", {}),
        ]
        extras = [
            ("changelist, page 200", "/admin/runs/run/?p=200", {}),
            (
                "changelist by tenant + queue",
                "/admin/runs/run/?tenant__id__exact=" + str(get_tenant_id()) + "&queue=short",
                {},
            ),
            ("search by idempotency key", f"/admin/runs/run/?q={ids['idempotency_key']}", {}),
            ("search by run id", f"/admin/runs/run/?q={ids['run_with_steps']}", {}),
            (
                "overview panel (htmx)",
                "/admin/runs/run/overview/?panel=queues",
                {"HX-Request": "true"},
            ),
            ("step changelist", "/admin/runs/step/", {}),
            ("tenant changelist", "/admin/runs/tenant/", {}),
            ("worker changelist", "/admin/runs/worker/", {}),
            # Prometheus's scrape (runs.metrics), with 50 processes' published figures.
            ("GET /metrics", "/metrics", {"Authorization": f"Bearer {publish_fleet(50)}"}),
        ]
        say()
        say(f"{'page':32} {'p50 ms':>8} {'max ms':>8} {'queries':>8}")
        results = []
        for label, url, headers in pages + extras:
            result = measure(client, label, url, repeat=args.repeat, headers=headers)
            results.append(result)
            flag = (
                ""
                if result["p50"] < TARGET_MS or (label, url, headers) in extras
                else "  OVER TARGET"
            )
            say(
                f"{label:32} {result['p50']:8.1f} {result['max']:8.1f} {result['queries']:8d}{flag}"
            )
            if args.explain:
                for query in result["sql"]:
                    if query.lstrip().upper().startswith("SELECT") and "runs_run" in query:
                        say(f"    {query[:160]}")
                        say(explain(query))
        say()
        bulk(client)
        ok = all(r["p50"] < TARGET_MS for r in results[: len(pages)])
        say()
        say(
            f"target: each of the first {len(pages)} pages under {TARGET_MS:.0f} ms (p50): {'met' if ok else 'MISSED'}"
        )
        return 0 if ok else 1
    finally:
        db.drop()


def bulk(client) -> None:
    """Bulk actions on "select all" of a filtered list, as an operator does them: batches of 500."""
    from runs.models import Run

    tenant = get_tenant_id()
    cases = [
        (
            "bulk cancel: all paused runs",
            "cancel_runs",
            "status__exact=paused",
            {"status": "paused"},
            "cancelled",
        ),
        (
            "bulk retry: one tenant's fatal failures",
            "retry_runs",
            f"status__exact=failed&error_kind__exact=fatal&tenant__id__exact={tenant}",
            {"status": "failed", "error_kind": "fatal", "tenant_id": tenant},
            "queued",
        ),
    ]
    for label, action, query, lookup, reached in cases:
        ids = list(Run.objects.filter(**lookup).values_list("pk", flat=True))
        started = time.perf_counter()
        response = client.post(
            f"/admin/runs/run/?{query}",
            {
                "action": action,
                "select_across": "1",
                "index": "0",
                "_selected_action": [str(ids[0])],
                "apply": "1",  # past the confirmation page (runs.admin.confirmations)
            },
        )
        seconds = time.perf_counter() - started
        changed = Run.objects.filter(pk__in=ids, status=reached).count()
        if response.status_code != 302 or changed != len(ids):
            raise RuntimeError(f"{label}: {changed} of {len(ids)} runs reached {reached}")
        say(f"{label:40} {len(ids):6,} runs in {seconds:5.2f} s ({len(ids) / seconds:,.0f} runs/s)")


def get_tenant_id():
    from runs.models import Tenant

    return Tenant.objects.order_by("slug").values_list("pk", flat=True)[3]


if __name__ == "__main__":
    sys.exit(main())
