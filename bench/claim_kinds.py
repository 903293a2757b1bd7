"""Claim cost with a backlog of kinds the worker cannot claim (docs/architecture.md: the claim).

    .venv/bin/python bench/claim_kinds.py
    .venv/bin/python bench/claim_kinds.py --queued 20000 --iterations 200
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/claim_kinds.py

The claim must cost what it costs without runs it cannot take: 100,000
queued runs of a paused kind (runs_kindstate) or of a kind the claiming
worker has not registered, in the same tenant and queue as a few claimable
runs, and ahead of them in claim order (better priority), must not be
scanned by every claim. Like bench/claim_isolation.py it uses DATABASE_URL
or the embedded PostgreSQL, works in a database ``bench_<pid>`` of its own
(dropped at the end), and times ``runs.engine.claim.claim(...)`` exactly as a
worker calls it, giving each claimed run back (untimed) so that every
iteration claims one run from the same queue. Figures are printed, never
asserted.

The claiming worker registers ``bench_claim``, ``bench_claim_b`` and
``bench_paused`` (paused). Scenarios, in one tenant with free slots:

1. 5 claimable runs (3 of bench_claim, 2 of bench_claim_b): the baseline.
2. The same with 100,000 queued runs of bench_paused ahead of them.
3. The same with those 100,000 runs of ``kind_this_worker_lacks`` instead.
4. Both backlogs at once (200,000 runs the worker cannot take).

Every scenario first checks that a claim of all claimable runs returns
exactly the runs ``ORDER BY priority, started_at IS NULL, run_after, id``
says, across kinds, and never one of a paused or unregistered kind; then it
times claims of 1 and of 5 (p50/p99, committed and the statement alone).
EXPLAIN (ANALYZE, BUFFERS) of one claim is printed for scenarios 1 and 2.
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

from bench.claim_isolation import QUEUE, Claimer, analyze, insert_queued, make_tenant  # noqa: E402
from bench.common import Database, say, sql  # noqa: E402

CLAIMABLE = ("bench_claim", "bench_claim_b")
PAUSED = "bench_paused"
UNREGISTERED = "kind_this_worker_lacks"
KINDS = {"bench_claim": 1, "bench_claim_b": 1, PAUSED: 1}


class KindsClaimer(Claimer):
    """bench/claim_isolation.py's Claimer, claiming the kinds of this bench."""

    def claim(self, n: int = 1):
        from runs.engine import claim as claims

        return claims.claim(worker_id=self.worker_id, queues=[QUEUE], kinds=KINDS, n=n, lease=3600)


def expected_order(tenant) -> list:
    """The claimable runs in claim order, as plain SQL says it."""
    return [
        row[0]
        for row in sql(
            "SELECT id FROM runs_run WHERE tenant_id = %(t)s AND status = 'queued' AND queue = %(q)s"
            " AND run_after <= statement_timestamp() AND kind = ANY(%(k)s)"
            " ORDER BY priority, (started_at IS NULL), run_after, id",
            {"t": tenant.pk, "q": QUEUE, "k": list(CLAIMABLE)},
        )
    ]


def check_order(claimer: KindsClaimer, tenant, label: str) -> None:
    """One claim of every claimable run returns them in claim order; then they are given back."""
    from django.db import transaction

    want = expected_order(tenant)
    with transaction.atomic():
        claimed = claimer.claim(len(want) + 5)
        transaction.set_rollback(True)
    # The claim's RETURNING has no order of its own: compare as the claim
    # would have picked them (the n best), then the set.
    got_ids = [c.id for c in claimed]
    wrong_kind = [c.kind for c in claimed if c.kind not in CLAIMABLE]
    ok = set(got_ids) == set(want) and not wrong_kind
    partial = []
    for n in (1, 2, 3):
        with transaction.atomic():
            top = [c.id for c in claimer.claim(n)]
            transaction.set_rollback(True)
        partial.append(set(top) == set(want[:n]))
    say(
        f"  verify: a claim of all takes {len(got_ids)} of {len(want)} claimable runs, "
        f"of kinds {sorted({c.kind for c in claimed})}; claims of 1, 2, 3 take the 1, 2, 3 best in "
        f"ORDER BY priority, fresh, run_after, id: {partial} -> {'OK' if ok and all(partial) else 'WRONG'}"
    )
    if not (ok and all(partial)):
        raise RuntimeError(f"{label}: the claim took the wrong runs")


def scenario(claimer: KindsClaimer, tenant, label: str, args, *, explain: bool) -> list[dict]:
    say()
    say(label)
    check_order(claimer, tenant, label)
    figures = [
        claimer.time_claims("claim of 1", iterations=args.iterations, n=1),
        claimer.time_claims("claim of 5 (all claimable)", iterations=args.iterations, n=5),
    ]
    if explain:
        say("  EXPLAIN (ANALYZE, BUFFERS) of a claim of 1 (rolled back):")
        for line in claimer.explain():
            say("    " + line)
    return figures


def run(args) -> list[dict]:
    from runs.models import KindState, Run

    claimer = KindsClaimer()
    tenant = make_tenant("tenant-kinds", max_running=1000)
    KindState.objects.create(name=PAUSED, paused=True)
    # The claimable runs lose on priority against every backlog run (0-8 there, 9 here):
    # only the kind filter lets them through. Mixed kinds, interleaved ages.
    for i, kind in enumerate(
        ("bench_claim", "bench_claim_b", "bench_claim", "bench_claim_b", "bench_claim")
    ):
        insert_queued(
            tenant,
            1,
            priority="9",
            kind=kind,
            run_after=f"statement_timestamp() - make_interval(secs => {100 + i})",
        )
    analyze()
    results = scenario(
        claimer,
        tenant,
        "1. 5 claimable runs of 2 registered kinds, nothing else queued",
        args,
        explain=True,
    )

    started = time.perf_counter()
    insert_queued(tenant, args.queued, priority="(g % 9)", kind=PAUSED)
    analyze()
    results += scenario(
        claimer,
        tenant,
        f"2. the same tenant and queue with {args.queued:,} queued runs of the paused kind {PAUSED} "
        f"(inserted in {time.perf_counter() - started:.1f} s, then VACUUM ANALYZE)",
        args,
        explain=True,
    )

    sql("UPDATE runs_run SET kind = %(u)s WHERE kind = %(p)s", {"u": UNREGISTERED, "p": PAUSED})
    analyze()
    results += scenario(
        claimer,
        tenant,
        f"3. those {args.queued:,} runs of {UNREGISTERED!r} instead (not registered by the worker)",
        args,
        explain=False,
    )

    insert_queued(tenant, args.queued, priority="(g % 9)", kind=PAUSED)
    analyze()
    results += scenario(
        claimer,
        tenant,
        f"4. both: {args.queued:,} paused and {args.queued:,} unregistered",
        args,
        explain=False,
    )
    queued = Run.objects.filter(tenant=tenant, status="queued").count()
    say()
    say(f"queued runs at the end: {queued:,} (5 claimable)")
    return results


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--queued", type=int, default=100_000, help="runs of each unclaimable kind (default 100000)"
    )
    parser.add_argument(
        "--iterations", type=int, default=500, help="timed claims per figure (default 500)"
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
        say("agentruns claim benchmark: queued runs of kinds the worker cannot claim")
        say("=" * 78)
        say(f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL (.data/pg)'}")
        say(f"PostgreSQL : {db.version}")
        say("settings   : " + ", ".join(f"{k}={v}" for k, v in sorted(db.settings.items())))
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        one, five, _ = os.getloadavg()
        say(
            f"machine    : {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {one:.2f} {five:.2f}"
        )
        indexes = sql(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'runs_run' AND indexname LIKE 'run_claim%%'"
        )
        for (definition,) in indexes:
            say(f"index      : {definition}")
        results = run(args)
        base = {r["n"]: r for r in results[:2]}
        say()
        say("summary (claim p50 / p99 ms, committed; the target: as without the backlog):")
        labels = [
            "1. nothing else",
            f"2. {args.queued:,} paused",
            f"3. {args.queued:,} unregistered",
            "4. both",
        ]
        for i, label in enumerate(labels):
            one, five = results[2 * i], results[2 * i + 1]
            say(
                f"  {label:<28} claim of 1: {one['p50']:6.2f} / {one['p99']:6.2f}   "
                f"claim of 5: {five['p50']:6.2f} / {five['p99']:6.2f}   "
                f"(x{one['p50'] / base[1]['p50']:.1f} and x{five['p50'] / base[5]['p50']:.1f} the baseline p50)"
            )
        return 0
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
