"""What a heartbeat costs as a worker holds more runs, and the dead rows it leaves under a held xmin.

    .venv/bin/python bench/heartbeat.py
    .venv/bin/python bench/heartbeat.py --baseline ../before --held 10,1000,10000
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/heartbeat.py

Uses DATABASE_URL or the embedded PostgreSQL, in a database ``bench_<pid>``
of its own, dropped at the end. With ``--baseline DIR`` the same
measurements also run against the checkout DIR (its code and migrations, in
a database of its own), one after the other in this one run, and the
figures are printed side by side. Figures are printed, never asserted.

1. Cost per heartbeat with ``--held`` runs held (default 10, 1,000 and
   10,000): one registered worker claims them (``claim(n=...)``, as a worker
   does) and calls ``runs.engine.claim.heartbeat(...)`` ``--beats`` times
   (lease 300 s), as its heartbeat thread does: latency p50, the PostgreSQL
   backend's CPU per beat (``/proc/<pg_backend_pid()>/schedstat``), and WAL
   bytes per beat (``pg_current_wal_lsn()`` around the beats: the whole
   server's WAL, so run it on a quiet server).

2. Dead rows under a held xmin: another session holds a snapshot open
   (``REPEATABLE READ``, one read, then idle in transaction: what a
   forgotten transaction or a long report does), so that no row version
   written meanwhile can be pruned or vacuumed; the worker holding
   ``--xmin-held`` runs (default 1,000) beats ``--xmin-beats`` times (default
   60: an hour of 60 s heartbeats, or a minute of 1 s ones); the dead rows
   the beats left are the growth of ``n_dead_tup`` of ``runs_run`` and
   ``runs_worker`` (pg_stat_user_tables, each read after a VACUUM that the
   held snapshot keeps from removing anything).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LEASE = 300


def child(code: Path, held_sizes: list[int], beats: int, xmin_held: int, xmin_beats: int) -> None:
    """Runs in a process whose ``runs`` package is ``code``'s: prints one JSON line of figures."""
    sys.path.insert(0, str(code))
    import psycopg

    from bench.claim_isolation import KINDS, QUEUE, insert_queued, make_tenant
    from bench.claim_scale import backend_cpu
    from bench.common import Database, pct, sql

    db = Database()
    try:
        db.setup()
        from runs.engine import claim as claims
        from runs.engine import fleet

        worker_id = uuid.uuid4()
        register = {"worker_id": worker_id, "queues": [QUEUE], "kinds": [], "concurrency": 1}
        if "lease" in inspect.signature(fleet.register_worker).parameters:
            register["lease"] = LEASE
        fleet.register_worker(**register)
        tenant = make_tenant("hb", max_running=10_000_000)
        biggest = max([*held_sizes, xmin_held])
        insert_queued(tenant, biggest)
        sql("VACUUM (ANALYZE) runs_run")
        held: dict[int, uuid.UUID] = {}

        def hold(n: int) -> None:
            while len(held) < n:
                got = claims.claim(
                    worker_id=worker_id,
                    queues=[QUEUE],
                    kinds=KINDS,
                    n=min(1000, n - len(held)),
                    lease=LEASE,
                )
                if not got:
                    raise RuntimeError(f"claimed {len(held)} of {n}")
                held.update({c.lease_token: c.id for c in got})

        def beat() -> None:
            kept = claims.heartbeat(worker_id=worker_id, held=held, lease=LEASE)
            if len(kept) != len(held):
                raise RuntimeError(f"heartbeat kept {len(kept)} of {len(held)} leases")

        figures: dict[str, dict] = {}
        for n in sorted(held_sizes):
            hold(n)
            for _ in range(3):  # prepared from its second execution
                beat()
            pid = sql("SELECT pg_backend_pid()")[0][0]
            _, sched0 = backend_cpu(pid)
            lsn0 = sql("SELECT pg_current_wal_lsn()::text")[0][0]
            times = []
            for _ in range(beats):
                started = time.perf_counter()
                beat()
                times.append((time.perf_counter() - started) * 1000)
            lsn1 = sql("SELECT pg_current_wal_lsn()::text")[0][0]
            _, sched1 = backend_cpu(pid)
            wal = sql("SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", [lsn1, lsn0])[0][0]
            figures[f"{n:,} held"] = {
                "p50 ms": pct(times, 50),
                "CPU ms": None if sched0 is None else (sched1 - sched0) * 1000 / beats,
                "WAL bytes": float(wal) / beats,
            }

        # Dead rows under a held xmin.
        hold(xmin_held)
        held = dict(list(held.items())[:xmin_held])
        sql("VACUUM runs_run, runs_worker")
        pin = psycopg.connect(os.environ["DATABASE_URL"])
        try:
            pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            pin.execute("SELECT count(*) FROM runs_tenant").fetchone()  # the snapshot is taken

            def dead_rows() -> dict[str, int]:
                # VACUUM counts what it could not remove; the held snapshot keeps it all.
                sql("VACUUM runs_run, runs_worker")
                sql("SELECT pg_stat_clear_snapshot()")
                return dict(
                    sql(
                        "SELECT relname, n_dead_tup FROM pg_stat_user_tables "
                        "WHERE relname IN ('runs_run', 'runs_worker')"
                    )
                )

            before = dead_rows()
            for _ in range(xmin_beats):
                beat()
            after = dead_rows()
            dead = {table: after.get(table, 0) - before.get(table, 0) for table in after}
        finally:
            pin.rollback()
            pin.close()
        figures[f"dead rows, {xmin_held:,} held, {xmin_beats} beats"] = {
            "runs_run": dead.get("runs_run", 0),
            "runs_worker": dead.get("runs_worker", 0),
        }
        print("FIGURES " + json.dumps(figures), flush=True)
    finally:
        db.drop()


def measure(label: str, code: Path, args) -> dict:
    env = dict(os.environ, PYTHONPATH=str(code))
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(code),
        "--held",
        args.held,
        "--beats",
        str(args.beats),
        "--xmin-held",
        str(args.xmin_held),
        "--xmin-beats",
        str(args.xmin_beats),
    ]
    proc = subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line.removeprefix("FIGURES "))
    raise SystemExit(f"{label} failed:\n{proc.stdout}\n{proc.stderr}")


def show(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--held", default="10,1000,10000", help="runs held, comma-separated")
    parser.add_argument("--beats", type=int, default=50, help="timed heartbeats per size")
    parser.add_argument("--xmin-held", type=int, default=1000, help="runs held under the xmin")
    parser.add_argument("--xmin-beats", type=int, default=60, help="heartbeats under the xmin")
    parser.add_argument("--baseline", help="also measure the checkout DIR")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        sizes = [int(part) for part in args.held.split(",")]
    except ValueError:
        parser.error("--held takes numbers separated by commas, for example 10,1000,10000")
    if not sizes or min(sizes) < 1 or args.beats < 1 or args.xmin_held < 1 or args.xmin_beats < 1:
        parser.error("--held, --beats, --xmin-held and --xmin-beats must be at least 1")
    if args.child:
        child(Path(args.child), sizes, args.beats, args.xmin_held, args.xmin_beats)
        return 0
    if args.baseline and not (Path(args.baseline) / "manage.py").is_file():
        parser.error(f"--baseline: {args.baseline} is not a checkout of this project")

    systems = [("this checkout", ROOT)]
    if args.baseline:
        systems.append((f"baseline {args.baseline}", Path(args.baseline).resolve()))
    one, five, _ = os.getloadavg()
    print(f"heartbeat cost; {args.beats} beats per size; load {one:.2f} {five:.2f}", flush=True)
    results = [(label, measure(label, code, args)) for label, code in systems]
    for row in results[0][1]:
        print(f"\n{row}")
        for label, figures in results:
            values = figures.get(row, {})
            print(f"  {label:>40}: " + ", ".join(f"{k} {show(v)}" for k, v in values.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
