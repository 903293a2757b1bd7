"""What a NOTIFY in every commit costs: why Event statements notify only for watched runs.

    .venv/bin/python bench/notify_cost.py            # 10 clients, 5 s per mode, 3 rounds
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/notify_cost.py

N clients each update their own row in autocommit, in four modes: plain;
the same update in the CTE shape the other two use;
with a pg_notify in the statement (as if every Event woke the streams);
and with a pg_notify only when the row is in a watch table, which it is not
(what runs.events does for a run nobody streams). PostgreSQL takes a lock
for the duration of every commit that sent a NOTIFY (to keep the
notification queue in commit order), so notifying commits cannot share a
WAL flush the way plain ones do. Runs on a scratch table of its own
database, which it drops.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

from bench.common import with_database  # noqa: E402

MODES = {
    "plain": "UPDATE notify_bench SET v = v + 1 WHERE id = %s",
    "same shape, no notify": (
        "WITH u AS (UPDATE notify_bench SET v = v + 1 WHERE id = %s RETURNING id) SELECT id FROM u"
    ),
    "notify every commit": (
        "WITH u AS (UPDATE notify_bench SET v = v + 1 WHERE id = %s RETURNING id)"
        " SELECT pg_notify('notify_bench', id::text) FROM u"
    ),
    "notify watched only": (
        "WITH u AS (UPDATE notify_bench SET v = v + 1 WHERE id = %s RETURNING id)"
        " SELECT pg_notify('notify_bench', id::text) FROM u"
        " WHERE EXISTS (SELECT 1 FROM notify_bench_watch w WHERE w.id = u.id)"
    ),
}


def rate(dsn: str, statement: str, *, clients: int, seconds: float) -> float:
    counts = [0] * clients
    stop = time.monotonic() + seconds

    def client(i: int) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while time.monotonic() < stop:
                conn.execute(statement, (i + 1,))
                counts[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from config.dbserver import ensure_database_url

    admin_dsn = ensure_database_url()  # the embedded server unless DATABASE_URL is set
    name = f"bench_notify_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    dsn = with_database(admin_dsn, name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE notify_bench (id int PRIMARY KEY, v int NOT NULL)")
            conn.execute(
                "INSERT INTO notify_bench SELECT g, 0 FROM generate_series(1, %s) g",
                (args.clients,),
            )
            conn.execute("CREATE UNLOGGED TABLE notify_bench_watch (id int PRIMARY KEY)")
            settings = dict(
                conn.execute(
                    "SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')"
                ).fetchall()
            )
            version = conn.execute("SHOW server_version").fetchone()[0]
        listener = psycopg.connect(dsn, autocommit=True)
        listener.execute("LISTEN notify_bench")  # a listener, as a web process would be
        print(
            f"PostgreSQL {version}, fsync={settings['fsync']}, synchronous_commit={settings['synchronous_commit']}; "
            f"{os.cpu_count()} CPUs; {args.clients} clients, {args.seconds:g} s per mode, {args.rounds} rounds"
        )
        results: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode, statement in MODES.items():
                results[mode].append(
                    rate(dsn, statement, clients=args.clients, seconds=args.seconds)
                )
                for _ in listener.notifies(timeout=0.01):
                    pass
        plain = statistics.median(results["plain"])
        for mode, values in results.items():
            median = statistics.median(values)
            print(
                f"  {mode:<22} median {median:7.0f} commits/s  ({median / plain:4.0%} of plain)"
                f"   rounds: {', '.join(f'{v:.0f}' for v in values)}"
            )
        listener.close()
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


if __name__ == "__main__":
    main()
