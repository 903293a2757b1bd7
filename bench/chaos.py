"""Chaos bench: SIGKILL a random worker every 1.5 s while runs with keyed and unkeyed side effects drain.

    .venv/bin/python bench/chaos.py                                  # 2 minutes, 2000 runs, 3 workers
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/chaos.py --minutes 0.5 --runs 300

Creates its own database ``bench_<pid>`` (bench.common.Database), submits
``--runs`` runs of ``bench_chaos`` (bench/agents.py: a plain step, a keyed
side effect, an unkeyed side effect), keeps ``--workers`` ``runworker``
processes alive (each killed one is replaced at once) plus ``reap --interval 1``,
and kills a random worker every ``--kill-every`` s for ``--minutes`` (or until
no run is left to work on). Then the survivors drain, and it prints:

- runs lost (submitted minus done, waiting for a person, failed, still live;
  and no run row may vanish): must be 0;
- keyed (run, step) pairs whose effect was called with more than one distinct
  key: must be 0 (calls repeated with the same key are fine, the callee
  deduplicates them, and are counted);
- unkeyed effects executed more than once for a run that was not handed to a
  person: must be 0;
- runs handed to a person (waiting_human, error_kind ambiguous: a worker died
  inside the unkeyed effect), failures by error_kind, kills, and throughput
  during the chaos and after it (runs finished per second, DB clock).

Exit status 1 if a must-be-0 figure is not 0. Every process it starts is
killed on exit (also on Ctrl-C / SIGTERM) and the database is dropped.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Children, Database, say, sql  # noqa: E402

PY = sys.executable
MANAGE = str(ROOT / "manage.py")
QUEUE = "bench_chaos"
LIVE = ("queued", "running", "waiting", "paused")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--minutes", type=float, default=2.0, help="how long to keep killing (default 2)"
    )
    p.add_argument(
        "--workers", type=int, default=3, help="runworker processes kept alive (default 3)"
    )
    p.add_argument(
        "--kill-every", type=float, default=1.5, help="seconds between kills (default 1.5)"
    )
    p.add_argument("--runs", type=int, default=2000, help="runs submitted up front (default 2000)")
    p.add_argument(
        "--concurrency", type=int, default=5, help="runs in flight per worker (default 5)"
    )
    p.add_argument(
        "--sleep", type=float, default=0.03, help="base seconds each step sleeps (default 0.03)"
    )
    p.add_argument("--lease", type=float, default=3.0)
    p.add_argument("--heartbeat", type=float, default=1.0)
    p.add_argument("--poll", type=float, default=0.2)
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for survivors (default 120)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed for choosing whom to kill")
    return p.parse_args(argv)


def db_now() -> float:
    return sql("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8")[0][0]


def live_count() -> int:
    return sql("SELECT count(*) FROM runs_run WHERE status = ANY(%s)", [list(LIVE)])[0][0]


class Chaos:
    def __init__(self, args, children: Children):
        self.args = args
        self.children = children
        self.workers: list[subprocess.Popen] = []
        self.started = 0
        self.kills = 0
        self.unexpected_exits: list[tuple[str, int]] = []
        self.rng = random.Random(args.seed)

    def start_worker(self) -> subprocess.Popen:
        a = self.args
        self.started += 1
        proc = self.children.start(
            f"worker-{self.started}",
            [
                PY,
                MANAGE,
                "runworker",
                "--queues",
                QUEUE,
                "--concurrency",
                str(a.concurrency),
                "--lease",
                str(a.lease),
                "--heartbeat",
                str(a.heartbeat),
                "--poll",
                str(a.poll),
            ],
        )
        self.workers.append(proc)
        return proc

    def replace_dead(self) -> None:
        """Start a new worker for each one that exited (killed by us, or on its own)."""
        for proc in list(self.workers):
            code = proc.poll()
            if code is None:
                continue
            self.workers.remove(proc)
            if code != -signal.SIGKILL:
                self.unexpected_exits.append((proc.bench_name, code))  # type: ignore[attr-defined]
            self.start_worker()

    def kill_one(self) -> None:
        alive = [p for p in self.workers if p.poll() is None]
        if not alive:
            return
        victim = self.rng.choice(alive)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        self.kills += 1
        self.replace_dead()


def create_tables() -> None:
    sql(
        "CREATE TABLE bench_chaos_attempts (run_id uuid NOT NULL, step text NOT NULL, key text NOT NULL, "
        "pid int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    sql(
        "CREATE TABLE bench_chaos_keyed (key text PRIMARY KEY, run_id uuid NOT NULL, pid int NOT NULL, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    sql(
        "CREATE TABLE bench_chaos_unkeyed (run_id uuid NOT NULL, pid int NOT NULL, "
        "at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    sql("CREATE TABLE bench_chaos_submitted (id uuid PRIMARY KEY)")


def submit(n: int, sleep: float) -> float:
    from django.db import transaction

    from runs.services import submit_run
    from runs.tenants import ensure_tenant

    tenant, _ = ensure_tenant(slug="bench-chaos", max_running=10_000, max_queued=10_000_000)
    t0 = time.perf_counter()
    ids = []
    with transaction.atomic():
        for _ in range(n):
            ids.append(
                submit_run(
                    tenant=tenant, kind="bench_chaos", input={"sleep": sleep}, queue=QUEUE
                ).id
            )
    from django.db import connection

    with connection.cursor() as cur:
        cur.executemany("INSERT INTO bench_chaos_submitted (id) VALUES (%s)", [(i,) for i in ids])
    sql("ANALYZE runs_run")
    return time.perf_counter() - t0


def report(
    args,
    chaos: Chaos,
    t_start: float,
    t_chaos_end: float,
    t_end: float,
    dry_at: float | None,
    drained: bool,
) -> int:
    n = args.runs
    status = dict(
        sql(
            "SELECT status, count(*) FROM runs_run r JOIN bench_chaos_submitted s ON s.id = r.id "
            "GROUP BY status"
        )
    )
    rows = sql("SELECT count(*) FROM runs_run WHERE id IN (SELECT id FROM bench_chaos_submitted)")[
        0
    ][0]
    vanished = n - rows
    done = status.get("done", 0)
    waiting_human = status.get("waiting_human", 0)
    failed = status.get("failed", 0)
    cancelled = status.get("cancelled", 0)
    live = sum(status.get(s, 0) for s in LIVE)
    lost = n - (done + waiting_human + failed + cancelled + live)
    wh_kinds = dict(
        sql(
            "SELECT coalesce(nullif(error_kind, ''), '(none)'), count(*) FROM runs_run "
            "WHERE status = 'waiting_human' GROUP BY 1"
        )
    )
    handed = wh_kinds.get("ambiguous", 0)
    failed_kinds = sql(
        "SELECT coalesce(nullif(error_kind, ''), '(none)'), count(*), "
        "left(min(coalesce(error, '')), 160) FROM runs_run WHERE status = 'failed' GROUP BY 1 "
        "ORDER BY 2 DESC"
    )
    # Where the handed-over runs stopped: which step is the written-ahead one.
    handed_steps = dict(
        sql(
            "SELECT s.name, count(*) FROM runs_run r JOIN runs_step s ON s.run_id = r.id "
            "WHERE r.status = 'waiting_human' AND s.status IN ('running', 'waiting') GROUP BY 1"
        )
    )
    # Keyed effects: the engine must never call one step's effect with two keys.
    multi_key = sql(
        "SELECT run_id, step, count(DISTINCT key), array_agg(DISTINCT key) FROM bench_chaos_attempts "
        "GROUP BY run_id, step HAVING count(DISTINCT key) > 1"
    )
    attempts, distinct_calls = sql(
        "SELECT count(*), count(DISTINCT (run_id, step, key)) FROM bench_chaos_attempts"
    )[0]
    repeated_same_key = attempts - distinct_calls
    runs_repeating = sql(
        "SELECT count(*) FROM (SELECT 1 FROM bench_chaos_attempts GROUP BY run_id, step, key "
        "HAVING count(*) > 1) x"
    )[0][0]
    keyed_applied = sql("SELECT count(*) FROM bench_chaos_keyed")[0][0]
    done_without_keyed = sql(
        "SELECT count(*) FROM runs_run r WHERE r.status = 'done' AND r.kind = 'bench_chaos' "
        "AND NOT EXISTS (SELECT 1 FROM bench_chaos_keyed k WHERE k.run_id = r.id)"
    )[0][0]
    # Unkeyed effects: more than once for a run is only acceptable if a person was asked.
    unkeyed_twice = sql(
        "SELECT u.run_id, count(*), r.status FROM bench_chaos_unkeyed u JOIN runs_run r "
        "ON r.id = u.run_id GROUP BY u.run_id, r.status HAVING count(*) > 1"
    )
    unkeyed_twice_bad = [row for row in unkeyed_twice if row[2] != "waiting_human"]
    done_without_unkeyed = sql(
        "SELECT count(*) FROM runs_run r WHERE r.status = 'done' AND r.kind = 'bench_chaos' "
        "AND NOT EXISTS (SELECT 1 FROM bench_chaos_unkeyed u WHERE u.run_id = r.id)"
    )[0][0]
    handed_with_effect = sql(
        "SELECT count(DISTINCT r.id) FROM runs_run r JOIN bench_chaos_unkeyed u ON "
        "u.run_id = r.id WHERE r.status = 'waiting_human'"
    )[0][0]
    # Throughput on the DB clock.
    in_chaos = sql(
        "SELECT count(*) FROM runs_run WHERE status IN ('done', 'failed') AND finished_at >= "
        "to_timestamp(%s) AND finished_at < to_timestamp(%s)",
        [t_start, t_chaos_end],
    )[0][0]
    after = sql(
        "SELECT count(*), EXTRACT(EPOCH FROM max(finished_at))::float8 FROM runs_run WHERE status IN "
        "('done', 'failed') AND finished_at >= to_timestamp(%s)",
        [t_chaos_end],
    )[0]
    last_finish = sql(
        "SELECT EXTRACT(EPOCH FROM max(finished_at))::float8 FROM runs_run WHERE finished_at < "
        "to_timestamp(%s)",
        [t_chaos_end],
    )[0][0]

    say()
    say("=" * 78)
    say("results")
    say("=" * 78)
    say(f"runs submitted                     : {n}")
    say(f"done                               : {done}")
    say(
        f"handed to a person                 : {handed} (waiting_human, error_kind ambiguous; "
        f"written-ahead step: {handed_steps or '-'}; {handed_with_effect} of them had applied the effect)"
    )
    other_wh = {k: v for k, v in wh_kinds.items() if k != "ambiguous"}
    if other_wh:
        say(f"  other waiting_human              : {other_wh}")
    say(
        f"failed                             : {failed}"
        + (
            ""
            if not failed_kinds
            else " ("
            + "; ".join(f"{kind}: {count}, e.g. {error!r}" for kind, count, error in failed_kinds)
            + ")"
        )
    )
    if cancelled:
        say(f"cancelled                          : {cancelled}")
    say(
        f"still live at the end              : {live}"
        + (f" { ({s: status[s] for s in LIVE if s in status}) }" if live else "")
    )
    say(f"LOST (must be 0)                   : {lost} (run rows vanished: {vanished})")
    say(
        f"KEYED (run, step) with >1 key (0)  : {len(multi_key)}"
        + (f" e.g. {multi_key[:3]}" if multi_key else "")
    )
    say(
        f"keyed calls repeated, same key     : {repeated_same_key} extra calls on {runs_repeating} steps "
        f"({attempts} calls, {keyed_applied} applied by the idempotent callee); "
        f"done runs without a keyed effect: {done_without_keyed}"
    )
    say(
        f"UNKEYED >1 not handed over (0)     : {len(unkeyed_twice_bad)}"
        + (f" e.g. {unkeyed_twice_bad[:3]}" if unkeyed_twice_bad else "")
        + f" ({len(unkeyed_twice)} runs executed it more than once in all); "
        f"done runs without an unkeyed effect: {done_without_unkeyed}"
    )
    say(
        f"kills                              : {chaos.kills} SIGKILLs, {chaos.started} workers started"
        + (
            f"; workers that exited on their own: {chaos.unexpected_exits}"
            if chaos.unexpected_exits
            else ""
        )
    )
    chaos_s = t_chaos_end - t_start
    say(
        f"throughput during the chaos        : {in_chaos} runs finished in {chaos_s:.1f} s -> "
        f"{in_chaos / chaos_s:.1f} runs/s"
    )
    if dry_at is not None and last_finish:
        busy = max(last_finish - t_start, 1e-9)
        say(
            f"  (no run was left to work on after {dry_at - t_start:.1f} s of chaos; the chaos ended there; "
            f"over the busy part, to the last finish: {in_chaos / busy:.1f} runs/s)"
        )
    after_n, after_last = after
    if after_n:
        span = max((after_last or t_chaos_end) - t_chaos_end, 1e-9)
        say(
            f"throughput after the chaos         : {after_n} runs finished in {span:.1f} s -> "
            f"{after_n / span:.1f} runs/s"
        )
    else:
        say("throughput after the chaos         : nothing left to finish")
    if not drained:
        say(f"DRAIN TIMED OUT after {args.drain_timeout:.0f} s with {live} runs live")
    bad = lost or vanished or multi_key or unkeyed_twice_bad
    say(
        f"verdict                            : {'FAILED' if bad else 'OK'} "
        f"(total bench time after submit {t_end - t_start:.0f} s)"
    )
    return 1 if bad else 0


def main(argv=None) -> int:
    args = parse_args(argv)

    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    db = Database(agent_modules="bench.agents")
    logdir = Path(tempfile.mkdtemp(prefix="bench-chaos-"))
    children = None
    try:
        db.setup()
        env = os.environ.copy()
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        say("=" * 78)
        say("agentruns chaos bench: SIGKILL a random worker while runs with side effects drain")
        say("=" * 78)
        say(f"PostgreSQL : {db.version}")
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        say(
            f"machine    : {os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        say(f"logs       : {logdir}")
        say(
            f"config     : {args.runs} runs of bench_chaos (plain, keyed side effect, unkeyed side effect, "
            f"~{args.sleep * 1000:.0f} ms each); {args.workers} workers x concurrency {args.concurrency}, "
            f"lease {args.lease} s, heartbeat {args.heartbeat} s, poll {args.poll} s; reap --interval 1; "
            f"a SIGKILL every {args.kill_every} s for {args.minutes} min"
        )
        create_tables()
        enqueue_s = submit(args.runs, args.sleep)
        say(f"submitted  : {args.runs} runs in {enqueue_s:.2f} s")

        children = Children(logdir, env)
        chaos = Chaos(args, children)
        children.start("reaper", [PY, MANAGE, "reap", "--interval", "1"])
        t_start = db_now()
        for _ in range(args.workers):
            chaos.start_worker()
        chaos_end = time.monotonic() + args.minutes * 60
        next_kill = time.monotonic() + args.kill_every
        dry_at = None
        last_note = time.monotonic()
        while time.monotonic() < chaos_end:
            time.sleep(min(0.1, max(0.0, next_kill - time.monotonic())))
            chaos.replace_dead()
            if time.monotonic() >= next_kill:
                chaos.kill_one()
                next_kill += args.kill_every
                if live_count() == 0:
                    dry_at = db_now()
                    break
            if time.monotonic() - last_note >= 10:
                last_note = time.monotonic()
                st = dict(sql("SELECT status, count(*) FROM runs_run GROUP BY status"))
                say(
                    f"  chaos {time.monotonic() - (chaos_end - args.minutes * 60):5.0f} s: {chaos.kills} kills, "
                    f"statuses {st}"
                )
        t_chaos_end = db_now()
        say(
            f"chaos over : {chaos.kills} kills in {t_chaos_end - t_start:.1f} s; draining (timeout "
            f"{args.drain_timeout:.0f} s)"
        )
        drain_end = time.monotonic() + args.drain_timeout
        drained = False
        while time.monotonic() < drain_end:
            chaos.replace_dead()
            if live_count() == 0:
                drained = True
                break
            time.sleep(0.2)
        t_end = db_now()
        children.stop()
        return report(args, chaos, t_start, t_chaos_end, t_end, dry_at, drained)
    finally:
        if children is not None:
            children.stop(grace=5)
        try:
            db.drop()
        except Exception as exc:
            say(f"could not drop database {getattr(db, 'name', '?')}: {exc}")


if __name__ == "__main__":
    sys.exit(main())
