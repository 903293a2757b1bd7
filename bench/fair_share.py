"""The claim's latency with 1,000 tenants that all have work, fair share on, beside another checkout.

    .venv/bin/python bench/fair_share.py
    .venv/bin/python bench/fair_share.py --baseline ../before-fair-share --iterations 300
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/fair_share.py

Fair share (runs/sql/claim.sql, ``picked``) ranks every candidate run by its
tenant's running per unit of weight: each tenant with a free slot offers its
best runs, so the claim's cost grows with the tenants that have runnable
work, never with the runs they cannot take. This bench prints that cost:

1. 1,000 tenants, each with a free slot, 5 queued runs and 0 to 4 running
   (so their shares differ), weights 1 to 3, and one tenant with
   ``--backlog`` queued runs (default 100,000) and max_running above what
   is claimed: claims of 1 and of 10 runs.
2. The same with only the big tenant and 10 others having work.

Each claim is ``runs.engine.claim.claim(...)`` as a worker calls it
(autocommit, so the commit is included), the runs then given back
untimed, as bench/claim_isolation.py does. With ``--baseline DIR`` the same
scenarios also run against the checkout DIR (its code and migrations, in a
database of its own), one after the other in this one run, and the figures
are printed side by side. Figures are printed, never asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(code: Path, iterations: int, backlog: int) -> None:
    """Runs in a process whose ``runs`` package is ``code``'s: prints one JSON line of figures."""
    sys.path.insert(0, str(code))
    from bench.claim_isolation import Claimer, analyze, insert_queued, make_tenant
    from bench.common import Database, pct, sql

    db = Database()
    try:
        db.setup()
        import time

        from runs.models import Tenant

        has_weight = any(f.name == "weight" for f in Tenant._meta.get_fields())
        claimer = Claimer()
        big = make_tenant("big", max_running=100_000)
        insert_queued(big, backlog)
        tenants = []
        for i in range(1000):
            tenant = make_tenant(f"t-{i:04d}", max_running=10)
            tenants.append(tenant)
        if has_weight:
            sql("UPDATE runs_tenant SET weight = 1 + (hashtext(slug) & 1023) %% 3")
        # Five queued runs each; the counters say 0-4 running, so the shares differ.
        for tenant in tenants:
            insert_queued(tenant, 5)
        sql("UPDATE runs_tenant SET running = (hashtext(slug) & 1023) %% 5 WHERE slug LIKE 't-%%'")
        analyze()
        figures = {}

        def time_claims(label: str, n: int) -> None:
            samples = []
            for i in range(iterations + 20):
                started = time.perf_counter()
                claimed = claimer.claim(n)
                elapsed = (time.perf_counter() - started) * 1000
                if len(claimed) != n:
                    raise RuntimeError(f"{label}: claimed {len(claimed)} of {n}")
                claimer.give_back(claimed)
                if i >= 20:
                    samples.append(elapsed)
            figures[f"{label}, n={n}"] = (pct(samples, 50), pct(samples, 95), pct(samples, 99))

        for n in (1, 10):
            time_claims("1,000 tenants with work + 1 with a backlog", n)
        Tenant.objects.filter(slug__gte="t-0010", slug__startswith="t-").update(paused=True)
        analyze()
        for n in (1, 10):
            time_claims("10 tenants with work + 1 with a backlog", n)
        print("FIGURES " + json.dumps({"fair_share": has_weight, "figures": figures}), flush=True)
    finally:
        db.drop()


def measure(label: str, code: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            str(code),
            "--iterations",
            str(args.iterations),
            "--backlog",
            str(args.backlog),
        ],
        cwd=code,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line.removeprefix("FIGURES "))
    raise SystemExit(f"{label} failed:\n{proc.stdout}\n{proc.stderr}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--iterations", type=int, default=500, help="timed claims per figure")
    parser.add_argument("--backlog", type=int, default=100_000, help="the big tenant's queued runs")
    parser.add_argument("--baseline", help="also measure the checkout DIR (before fair share)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.iterations < 10 or args.backlog < 1:
        parser.error("--iterations must be at least 10 and --backlog at least 1")
    if args.child:
        child(Path(args.child), args.iterations, args.backlog)
        return 0
    if args.baseline and not (Path(args.baseline) / "manage.py").is_file():
        parser.error(f"--baseline: {args.baseline} is not a checkout of this project")

    systems = [("this checkout", ROOT)]
    if args.baseline:
        systems.append((f"baseline {args.baseline}", Path(args.baseline).resolve()))
    one, five, _ = os.getloadavg()
    print(
        f"claim latency, 1,000 tenants (fair share); {args.iterations} claims per figure; "
        f"big tenant's backlog {args.backlog:,}; load {one:.2f} {five:.2f}",
        flush=True,
    )
    results = [(label, measure(label, code, args)) for label, code in systems]
    print()
    print(
        "| scenario | " + " | ".join(f"{label} p50 / p95 / p99 (ms)" for label, _ in results) + " |"
    )
    print("|---|" + "--:|" * len(results))
    for scenario in results[0][1]["figures"]:
        cells = []
        for _, result in results:
            p50, p95, p99 = result["figures"][scenario]
            cells.append(f"{p50:.2f} / {p95:.2f} / {p99:.2f}")
        print(f"| {scenario} | " + " | ".join(cells) + " |")
    for label, result in results:
        print(f"{label}: fair share {'on' if result['fair_share'] else 'absent (claims by age)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
