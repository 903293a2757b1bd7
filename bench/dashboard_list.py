"""Dashboard benchmark: the run list and the polled partials with 100,000 runs in the table.

    .venv/bin/python bench/dashboard_list.py
    .venv/bin/python bench/dashboard_list.py --runs 1000000 --requests 100
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/dashboard_list.py

The issue's goal: the list page stays fast with 100,000 runs in the table.
Like bench/engine.py and bench/claim_isolation.py, it uses DATABASE_URL or
the embedded PostgreSQL, and works in a database ``bench_<pid>`` of its own,
dropped at the end.

One tenant gets ``--runs`` runs (one INSERT ... SELECT generate_series, then
VACUUM ANALYZE): mostly done, some failed and cancelled, a few waiting for a
person, paused, queued and running, the newest ones in flight, created 30 s
apart (a month for 100,000). A second tenant gets a tenth as many, so the
tenant filter has something to filter, and a third has 60 runs spread over
the whole month (its list must not walk everyone's newest runs). Every request goes through Django's
test Client as an approver (session, middleware, view, template), timed end
to end; each page is requested ``--requests`` times after a warm-up and its
p50 / p99 are printed with its query count. EXPLAIN (ANALYZE) of the list
query and of the approvals count follows.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, pct, say, sql  # noqa: E402

# The status of run g (1 = newest): the newest few are in flight, the rest
# follow a month of history. Running rows carry the lease the constraint asks for.
STATUS = """CASE
    WHEN g <= 3 THEN 'running' WHEN g <= 6 THEN 'queued' WHEN g <= 8 THEN 'waiting_human'
    WHEN g %% 1000 < 2 THEN 'waiting_human' WHEN g %% 1000 < 4 THEN 'paused'
    WHEN g %% 1000 < 40 THEN 'failed' WHEN g %% 1000 < 50 THEN 'cancelled' ELSE 'done' END"""

HTMX = {"HX-Request": "true"}


def insert_runs(tenant, n: int, *, spacing: int = 30) -> None:
    """n runs of ``tenant``, ``spacing`` seconds apart, in one INSERT ... SELECT generate_series."""
    from django.db import connection

    from runs.models import Run

    rows = {
        "id": "gen_random_uuid()",
        "tenant_id": "%(tenant)s",
        "kind": "(ARRAY['research_brief', 'bench_steps', 'bench_noop', 'bench_probe'])[1 + g %% 4]",
        "input": "jsonb_build_object('topic', 'company ' || g, 'depth', 3)",
        "status": "st",
        "attempt": "CASE WHEN st = 'queued' THEN 0 ELSE 1 END",
        "lease_token": "CASE WHEN st = 'running' THEN g END",
        "locked_by": "CASE WHEN st = 'running' THEN gen_random_uuid() END",
        "locked_until": "CASE WHEN st = 'running' THEN statement_timestamp() + interval '5 minutes' END",
        "created_at": "created",
        "updated_at": "created",
        "started_at": "CASE WHEN st <> 'queued' THEN created + interval '1 second' END",
        "finished_at": "CASE WHEN st IN ('done', 'failed', 'cancelled') THEN created + interval '20 seconds' END",
        "expires_at": "created + interval '7 days'",
        "request_hash": "md5(g::text)",
        "steps_total": "6",
        "steps_done": "CASE WHEN st = 'done' THEN 6 WHEN st = 'queued' THEN 0 ELSE 3 END",
        "current_step": "CASE WHEN st IN ('running', 'waiting_human', 'paused', 'failed') THEN 'extract_facts' "
        "ELSE '' END",
        "cost_cents": "(g %% 97) * 0.013",
        "last_event_seq": "6",
        # A realistic row: the list must not drag results and inputs along.
        "result": "CASE WHEN st = 'done' THEN jsonb_build_object('brief', repeat('lorem ipsum ', 60)) END",
        "error": "CASE WHEN st = 'failed' THEN 'step 4 (extract_facts): Fatal: the model refused the document' "
        "ELSE '' END",
        "error_kind": "CASE WHEN st = 'failed' THEN 'fatal' ELSE '' END",
    }
    params: dict = {"tenant": tenant.pk, "n": n}
    for field in Run._meta.concrete_fields:
        if field.column in rows or field.null or field.has_db_default():
            continue
        if not field.has_default():
            raise RuntimeError(
                f"runs_run.{field.column} has no default: give it a value in insert_runs()"
            )
        params[f"d_{field.column}"] = field.get_db_prep_save(field.get_default(), connection)
        rows[field.column] = f"%(d_{field.column})s"
    sql(
        f"INSERT INTO runs_run ({', '.join(rows)}) SELECT {', '.join(rows.values())}"
        f" FROM (SELECT g, {STATUS} AS st, statement_timestamp() - make_interval(secs => g * {spacing:d}) AS created"
        " FROM generate_series(1, %(n)s) AS g) AS s",
        params,
    )


def add_steps(run, n: int) -> None:
    """The timeline of the polled run: n finished steps with model-sized inputs and outputs."""
    from runs.models import Step

    Step.objects.bulk_create(
        Step(
            run=run,
            seq=seq,
            name=f"step{seq}",
            kind="llm" if seq % 2 else "tool",
            status="done",
            input={"args": [f"question {seq} " * 20]},
            output={"answer": f"finding {seq} " * 40},
            tokens_in=900,
            tokens_out=200,
            cost_cents=0.0255,
            started_at=run.created_at,
            ended_at=run.created_at,
        )
        for seq in range(1, n + 1)
    )


def measure(client, pages: list[tuple], requests: int) -> dict[str, dict]:
    """p50 / p99 of each page; the pages take turns, so a busy moment of the machine hits them all alike."""
    from django.db import connection

    results: dict[str, dict] = {}
    for name, path, headers, expect in pages:
        for _ in range(5):  # warm-up: template loading, plan caches
            client.get(path, headers=headers)
        # Counted with an execute wrapper: it survives the connection going back to the pool.
        queries: list[str] = []

        def count(execute, sql, *rest, queries=queries):
            queries.append(sql)
            return execute(sql, *rest)

        with connection.execute_wrapper(count):
            response = client.get(path, headers=headers)
        assert response.status_code == expect, (path, response.status_code, response.content[:500])
        results[name] = {"timings": [], "queries": len(queries), "bytes": len(response.content)}
    for _ in range(requests):
        for name, path, headers, _expect in pages:
            started = time.perf_counter()
            client.get(path, headers=headers)
            results[name]["timings"].append((time.perf_counter() - started) * 1000)
    for result in results.values():
        result["p50"], result["p99"] = pct(result["timings"], 50), pct(result["timings"], 99)
    return results


def list_sql(tenant, **filters) -> tuple[str, list]:
    """The SQL the list page runs, captured from the selector itself."""
    from django.db import connection

    from runs import selectors

    captured: list[tuple[str, list]] = []

    def capture(execute, sql, params, many, context):
        captured.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(capture):
        selectors.list_runs(tenant=tenant, limit=50, without_payloads=True, **filters)
    return captured[0]


def explain(query: str, params: list) -> str:
    rows = sql("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query, params)
    return "\n".join("    " + row[0] for row in rows)


def run(args) -> None:
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from runs.dashboard import presenters
    from runs.models import Membership, Run, Step, Tenant

    tenant = Tenant.objects.create(name="Acme", slug="acme", max_queued=10_000_000)
    other = Tenant.objects.create(name="Other", slug="other", max_queued=10_000_000)
    started = time.perf_counter()
    insert_runs(tenant, args.runs)
    insert_runs(other, max(1, args.runs // 10))
    # A small tenant whose 60 runs are spread over the whole month: its first page is
    # not among the table's newest rows, so an index without the tenant would not do.
    tiny = Tenant.objects.create(name="Tiny", slug="tiny", max_queued=10_000_000)
    insert_runs(tiny, 60, spacing=args.runs * 30 // 60)
    sql("VACUUM ANALYZE runs_run")
    sql("CHECKPOINT")  # the insert's writes are flushed before anything is timed
    say(
        f"inserted {args.runs:,} + {max(1, args.runs // 10):,} + 60 runs in {time.perf_counter() - started:.1f} s"
    )
    say(f"machine    : {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    user = get_user_model().objects.create_user("bench", password="bench-pass")
    Membership.objects.create(user=user, tenant=tenant, role=Membership.Role.APPROVER)
    client = Client()
    client.force_login(user)
    tiny_user = get_user_model().objects.create_user("tiny", password="bench-pass")
    Membership.objects.create(user=tiny_user, tenant=tiny, role=Membership.Role.APPROVER)
    tiny_client = Client()
    tiny_client.force_login(tiny_user)

    running = Run.objects.filter(tenant=tenant, status="running").order_by("-created_at").first()
    add_steps(running, args.steps)
    waiting = (
        Run.objects.filter(tenant=tenant, status="waiting_human").order_by("-created_at").first()
    )
    Step.objects.create(
        run=waiting,
        seq=4,
        name="publish",
        kind="approval",
        status="waiting",
        input={"proposal": {"title": "Brief", "body": "lorem ipsum " * 50}},
    )
    middle = Run.objects.filter(tenant=tenant).order_by("-created_at", "-id")[args.runs // 2]
    from runs.selectors import encode_cursor

    deep_cursor = encode_cursor(middle)
    prefix = str(middle.id)[:6]

    quiet = (
        f"/runs/{running.id}/?state={presenters.controls_version(running)}"
        f"&seen={presenters.timeline_version(running)}"
    )
    pages = [
        ("list page (first page, 50 rows)", "/", None, 200),
        ("list poll (htmx partial)", "/", HTMX, 200),
        ("list filtered: status=failed", "/?status=failed", None, 200),
        ("list filtered: status=waiting_human", "/?status=waiting_human", None, 200),
        ("list filtered: kind=bench_noop&status=done", "/?kind=bench_noop&status=done", None, 200),
        ("list search by id prefix", f"/?q={prefix}", None, 200),
        (
            f"list page {args.runs // 2 // 50:,} (keyset cursor)",
            f"/?cursor={deep_cursor}",
            None,
            200,
        ),
        ("run page (full)", f"/runs/{running.id}/", None, 200),
        ("run poll, nothing changed", quiet, HTMX, 200),
        (
            f"run poll, timeline changed ({args.steps} steps)",
            quiet.replace("&seen=", "&seen=old"),
            HTMX,
            200,
        ),
        (
            "run poll, waiting for approval, state changed",
            f"/runs/{waiting.id}/?state=old&seen=old",
            HTMX,
            200,
        ),
    ]
    say()
    say(f"{'request':52} {'p50 ms':>8} {'p99 ms':>8} {'queries':>8} {'KiB':>6}")
    results = measure(client, pages, args.requests)
    results |= measure(
        tiny_client, [("list page of a 60-run tenant among them", "/", None, 200)], args.requests
    )
    for name, result in results.items():
        say(
            f"{name:52} {result['p50']:8.2f} {result['p99']:8.2f} {result['queries']:8d} "
            f"{result['bytes'] / 1024:6.1f}"
        )

    say()
    for title, filters in [
        ("first page", {}),
        (f"page {args.runs // 2 // 50:,}", {"cursor": deep_cursor}),
        ("kind=bench_noop&status=done", {"kind": "bench_noop", "status": "done"}),
    ]:
        say(f"EXPLAIN of the list query ({title}):")
        say(explain(*list_sql(tenant, **filters)))
    qs = Run.objects.for_tenant(tenant).filter(status="waiting_human")
    compiled, params = qs.values("id").query.sql_with_params()
    say("EXPLAIN of the approvals count's scan:")
    say(explain(f"SELECT count(*) FROM ({compiled}) AS w", list(params)))
    say("EXPLAIN of the list query (first page of the 60-run tenant):")
    say(explain(*list_sql(tiny)))
    say(f"PostgreSQL: {connection.cursor().connection.info.server_version}")
    first = results["list page (first page, 50 rows)"]
    say()
    say(
        f"list page with {args.runs:,} runs: p50 {first['p50']:.1f} ms, p99 {first['p99']:.1f} ms "
        f"({first['queries']} queries)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=100_000, help="runs of the measured tenant (default 100,000)"
    )
    parser.add_argument(
        "--requests", type=int, default=50, help="timed requests per page (default 50)"
    )
    parser.add_argument(
        "--steps", type=int, default=30, help="steps in the polled run's timeline (default 30)"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    database = Database(agent_modules="bench.agents")
    try:
        database.setup()
        say(f"database   : {database.name} ({database.version.split(',')[0]})")
        run(args)
        return 0
    finally:
        database.drop()


if __name__ == "__main__":
    sys.exit(main())
