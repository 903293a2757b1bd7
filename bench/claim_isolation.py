"""Claim isolation benchmark (the per-tenant limit, docs/architecture.md: the claim).

    .venv/bin/python bench/claim_isolation.py
    .venv/bin/python bench/claim_isolation.py --queued 20000 --iterations 200
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/claim_isolation.py

The issue's target: with tenant A at its limit (max_running=2, 2 running)
and 100,000 of its runs queued, a claim of tenant B's run stays under 10 ms.
Like bench/engine.py, it uses DATABASE_URL or the embedded PostgreSQL, and
works in a database ``bench_<pid>`` of its own, dropped at the end.

Every timed claim is ``runs.engine.claim.claim(...)`` exactly as a worker calls
it (one statement, autocommit, so the commit is included); the claimed runs
are given back with ``runs.engine.exit.leave(Exit.release(...))``,
untimed, so that each claim meets the same queue. Scenarios:

1. A at its limit with 0 queued: B's claim (the baseline).
2. A at its limit with 100,000 queued (one INSERT ... SELECT generate_series,
   then ANALYZE): B's claim, and EXPLAIN (ANALYZE, BUFFERS) of it.
3. A with a free slot and the same backlog: the claim takes A's best run.
4. Tenants with queued runs and free slots: 1 vs 50, claims of 1 and of 10.
5. B alongside 1,000 tenants with a free slot and nothing queued.
6. B alongside a tenant with free slots whose 100,000 queued runs the claim
   cannot take: sleeping (run_after in the future), or of a kind the worker
   does not claim (a paused kind, a rolling deploy).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, pct, say, sql  # noqa: E402

TARGET_P99_MS = 10.0
KIND = "bench_claim"  # claimed, never executed: no agent module is needed
QUEUE = "default"
KINDS = {KIND: 1}


def make_tenant(slug: str, *, max_running: int):
    from runs.models import Tenant

    return Tenant.objects.create(
        name=slug, slug=slug, max_running=max_running, max_queued=10_000_000
    )


def insert_queued(
    tenant,
    n: int,
    *,
    priority: str = "(g % 10)",
    kind: str = KIND,
    run_after: str = "statement_timestamp() - make_interval(secs => g)",
) -> None:
    """n queued runs of ``tenant`` in one INSERT ... SELECT generate_series.

    Every NOT NULL column without a database default gets its model default,
    so the rows look like submit_run's; priorities cycle 0-9 and ages spread
    over n seconds, so the claim index holds a realistic mix.
    """
    from django.db import connection

    from runs.models import Run

    rows = {
        "id": "gen_random_uuid()",
        "tenant_id": "%(tenant)s",
        "kind": "%(kind)s",
        "queue": "%(queue)s",
        "priority": priority.replace("%", "%%"),
        "input": "jsonb_build_object('i', g)",
        "status": "'queued'",
        "run_after": run_after,
        "created_at": "statement_timestamp() - make_interval(secs => g)",
        "updated_at": "statement_timestamp()",
        "expires_at": "statement_timestamp() + interval '7 days'",
        "request_hash": "md5(g::text)",
    }
    params: dict = {"tenant": tenant.pk, "kind": kind, "queue": QUEUE, "n": n}
    for field in Run._meta.concrete_fields:
        if field.column in rows or field.null or field.has_db_default():
            continue
        if not field.has_default():
            raise RuntimeError(
                f"runs_run.{field.column} has no default: give it a value in insert_queued()"
            )
        params[f"d_{field.column}"] = field.get_db_prep_save(field.get_default(), connection)
        rows[field.column] = f"%(d_{field.column})s"
    sql(
        f"INSERT INTO runs_run ({', '.join(rows)}) SELECT {', '.join(rows.values())}"
        " FROM generate_series(1, %(n)s) AS g",
        params,
    )
    # What the after-commit counter of submit_run would have done.
    sql(
        "UPDATE runs_tenant SET queued = queued + %(n)s WHERE id = %(tenant)s",
        {"n": n, "tenant": tenant.pk},
    )


def analyze() -> None:
    sql("VACUUM ANALYZE runs_run")
    sql("VACUUM ANALYZE runs_tenant")


class Claimer:
    def __init__(self) -> None:
        self.worker_id = uuid.uuid4()

    def claim(self, n: int = 1):
        from runs.engine import claim as claims

        return claims.claim(worker_id=self.worker_id, queues=[QUEUE], kinds=KINDS, n=n, lease=3600)

    @staticmethod
    def give_back(claimed) -> None:
        from runs.engine.exit import Exit, leave

        for run in claimed:
            if leave(Exit.release(reason="bench").of_run(run.id, run.lease_token)) is None:
                raise RuntimeError(f"could not give run {run.id} back")

    def time_claims(
        self,
        label: str,
        *,
        iterations: int,
        n: int = 1,
        expect_tenants=None,
        expect_count: int | None = None,
    ) -> dict:
        """Time ``iterations`` claims twice: as a worker does (autocommit, the commit's WAL flush
        included, the runs then given back), and the statement alone (inside a transaction that
        is rolled back afterwards, untimed). Checks that every claim took what was expected."""
        from django.db import transaction

        want = n if expect_count is None else expect_count
        warmup = max(10, iterations // 20)

        def check(claimed) -> None:
            if len(claimed) != want:
                raise RuntimeError(f"{label}: claimed {len(claimed)} runs, expected {want}")
            if expect_tenants is not None and not {c.tenant_id for c in claimed} <= expect_tenants:
                raise RuntimeError(f"{label}: claimed another tenant's run")

        committed, alone = [], []
        for i in range(warmup + iterations):
            started = time.perf_counter()
            claimed = self.claim(n)
            elapsed = (time.perf_counter() - started) * 1000
            check(claimed)
            self.give_back(claimed)
            if i >= warmup:
                committed.append(elapsed)
        for i in range(warmup + iterations):
            with transaction.atomic():
                started = time.perf_counter()
                claimed = self.claim(n)
                elapsed = (time.perf_counter() - started) * 1000
                transaction.set_rollback(True)
            check(claimed)
            if i >= warmup:
                alone.append(elapsed)
        figures = {
            "label": label,
            "n": n,
            "count": iterations,
            "p50": pct(committed, 50),
            "p99": pct(committed, 99),
            "stmt_p50": pct(alone, 50),
            "stmt_p99": pct(alone, 99),
        }
        say(
            f"  {label:<52} n={n:<3} claim p50 {figures['p50']:6.2f} p99 {figures['p99']:6.2f} ms"
            f" | statement p50 {figures['stmt_p50']:6.2f} p99 {figures['stmt_p99']:6.2f} ms"
        )
        return figures

    def explain(self) -> list[str]:
        """EXPLAIN (ANALYZE, BUFFERS) of the very statement claim() sends, rolled back afterwards."""
        from django.db import connection, transaction

        captured: dict = {}

        class Captured(Exception):
            pass

        def capture(execute, query, params, many, context):
            captured.update(sql=query, params=params)
            raise Captured

        with connection.execute_wrapper(capture):
            try:
                self.claim(1)
            except Captured:
                pass
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + captured["sql"], captured["params"]
            )
            plan = [row[0] for row in cursor.fetchall()]
            transaction.set_rollback(True)
        return plan


def counters(tenant) -> tuple[int, int]:
    from runs.models import Tenant

    return Tenant.objects.values_list("running", "queued").get(pk=tenant.pk)


def run(args) -> list[dict]:
    from runs.models import Run, Tenant

    claimer = Claimer()
    results = []
    a = make_tenant("tenant-a", max_running=2)
    b = make_tenant("tenant-b", max_running=10)
    # A's two running runs: claimed for real, so the counter and the rows agree.
    insert_queued(a, 2)
    held = claimer.claim(2)
    assert {c.tenant_id for c in held} == {a.pk} and len(held) == 2
    # B's runs lose on priority, age aside: only the limit lets them through.
    insert_queued(b, 5, priority="9")
    analyze()
    assert counters(a)[0] == 2

    say()
    say("1. tenant A at its limit (2 of 2 running), 0 queued; B has 5 queued")
    results.append(
        claimer.time_claims(
            "B's claim, A with 0 queued", iterations=args.iterations, expect_tenants={b.pk}
        )
    )

    started = time.perf_counter()
    insert_queued(a, args.queued)
    loaded = time.perf_counter() - started
    analyze()
    say()
    say(
        f"2. tenant A at its limit with {args.queued:,} queued (inserted in {loaded:.1f} s, then VACUUM ANALYZE)"
    )
    isolated = claimer.time_claims(
        f"B's claim, A with {args.queued:,} queued",
        iterations=args.iterations,
        expect_tenants={b.pk},
    )
    results.append(isolated)
    assert counters(a)[0] == 2
    assert Run.objects.filter(tenant=a, status="queued").count() == args.queued
    say()
    say("   EXPLAIN (ANALYZE, BUFFERS) of that claim (rolled back):")
    for line in claimer.explain():
        say("     " + line)

    say()
    say("3. tenant A with a free slot and the same backlog: the claim takes A's best run")
    Tenant.objects.filter(pk=a.pk).update(max_running=3)
    Tenant.objects.filter(pk=b.pk).update(paused=True)
    results.append(
        claimer.time_claims(
            f"A's claim from {args.queued:,} queued",
            iterations=args.iterations,
            expect_tenants={a.pk},
        )
    )
    Tenant.objects.filter(pk=a.pk).update(max_running=2)
    Tenant.objects.filter(pk=b.pk).update(paused=False)

    say()
    say("4. tenants with queued runs and free slots (A still at its limit with its backlog)")
    for n in (1, 10):
        results.append(
            claimer.time_claims(
                "1 tenant with queued runs (B, 5 queued)",
                iterations=args.iterations,
                n=n,
                expect_count=min(n, 5),
                expect_tenants={b.pk},
            )
        )
    others = [make_tenant(f"tenant-{i:03d}", max_running=10) for i in range(49)]
    for tenant in others:
        insert_queued(tenant, 5, priority="9")
    analyze()
    for n in (1, 10):
        results.append(
            claimer.time_claims(
                "50 tenants (B and 49 more, 5 queued each)", iterations=args.iterations, n=n
            )
        )
    Tenant.objects.filter(pk__in=[t.pk for t in others]).update(paused=True)

    say()
    say("5. B alongside 1,000 tenants with a free slot and nothing queued (the claim visits each)")
    Tenant.objects.bulk_create(
        [Tenant(name=f"idle-{i}", slug=f"idle-{i:04d}", max_running=5) for i in range(1000)]
    )
    analyze()
    results.append(
        claimer.time_claims(
            "B's claim, 1,000 idle tenants", iterations=args.iterations, expect_tenants={b.pk}
        )
    )
    assert counters(a)[0] == 2
    Tenant.objects.filter(slug__startswith="idle-").delete()

    say()
    say(
        f"6. B alongside a tenant with free slots and {args.queued:,} queued runs the claim cannot take"
    )
    sleeping = make_tenant("tenant-sleeping", max_running=10)
    insert_queued(
        sleeping,
        args.queued,
        priority="0",
        run_after="statement_timestamp() + interval '1 hour' + make_interval(secs => g)",
    )
    analyze()
    results.append(
        claimer.time_claims(
            f"B's claim, {args.queued:,} sleeping (future run_after)",
            iterations=args.iterations,
            expect_tenants={b.pk},
        )
    )
    Tenant.objects.filter(pk=sleeping.pk).update(paused=True)
    unclaimable = make_tenant("tenant-other-kind", max_running=10)
    insert_queued(unclaimable, args.queued, priority="0", kind="kind_this_worker_lacks")
    analyze()
    results.append(
        claimer.time_claims(
            f"B's claim, {args.queued:,} of a kind not claimed",
            iterations=args.iterations,
            expect_tenants={b.pk},
        )
    )
    say()
    say("   EXPLAIN (ANALYZE, BUFFERS) of that last claim (rolled back):")
    for line in claimer.explain():
        say("     " + line)
    return results


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--queued", type=int, default=100_000, help="tenant A's backlog (default 100000)"
    )
    parser.add_argument(
        "--iterations", type=int, default=1000, help="timed claims per scenario (default 1000)"
    )
    args = parser.parse_args(argv)
    if args.queued < 1 or args.iterations < 10:
        parser.error("--queued must be at least 1 and --iterations at least 10")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through the finally block, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    db = Database()
    try:
        db.setup()
        say("=" * 78)
        say("agentruns claim isolation benchmark")
        say("=" * 78)
        say(f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL (.data/pg)'}")
        say(f"PostgreSQL : {db.version}")
        say("settings   : " + ", ".join(f"{k}={v}" for k, v in sorted(db.settings.items())))
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        one, five, _ = os.getloadavg()
        say(
            f"machine    : {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {one:.2f} {five:.2f}"
        )
        results = run(args)
        isolated = results[1]
        ok = isolated["p99"] < TARGET_P99_MS
        say()
        say(
            f"target: B's claim with {args.queued:,} queued for A at its limit under {TARGET_P99_MS:.0f} ms: "
            f"p50 {isolated['p50']:.2f} ms, p99 {isolated['p99']:.2f} ms -> {'met' if ok else 'NOT MET'}"
        )
        return 0 if ok else 1
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
