"""Retention benchmark: pruning a million finished runs while two workers drain fresh ones (issue 14).

    .venv/bin/python bench/retention.py                    # 1,000,000 old runs (about ten minutes)
    .venv/bin/python bench/retention.py --runs 20000       # try it small first
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/retention.py

Like bench/engine.py it uses DATABASE_URL or the embedded PostgreSQL and
works in a database ``bench_<pid>`` of its own, dropped at the end.

The fill is set-based SQL (``INSERT ... SELECT generate_series``): ``--runs``
finished runs (done, failed, cancelled) of one tenant, finished between 31
and 91 days ago, each with one step and three events; every 50th is the
child of the run finished after it, so families go leaf first. Then
VACUUM ANALYZE, as autovacuum would have.

Then a feeder thread submits one-step no-op runs (``bench_steps``) with
``submit_run`` at a steady ``--rate``, and two ``runworker`` processes drain
them as they come (LISTEN/NOTIFY wakes them). Three phases:

1. before: ``--seconds`` of that, nothing pruned;
2. during: the Reaper's retention passes (``Reaper.prune``, the settings'
   defaults: batches of 500, 50 ms pauses, at most 5 s a pass), one pass
   after the other in this process until the old runs are gone. A real
   reaper runs one pass a minute (RUNS_RETENTION_INTERVAL_SECONDS), so it
   would catch up on such a backlog over a longer time; the passes here are
   the same;
3. after: ``--seconds`` more.

Claim latency is submit to claim on the database's clock (``claimed_at -
run_after`` of every fresh run, both written by PostgreSQL), p50 and p95 per
phase and per window of ``--window`` seconds; the drain rate is fresh runs
finished per second. Figures are printed, never asserted; the machine is
shared, so its load is printed too.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.admin_million import insert_select  # noqa: E402
from bench.common import Database, pct, say, sql  # noqa: E402

PY = sys.executable
MANAGE = str(ROOT / "manage.py")
FRESH_QUEUE = "bench_tp"  # bench_steps' queue (bench/agents.py)
OLD_QUEUE = "bench_old"  # no worker listens on it: the old runs only wait to be pruned
FAMILY_EVERY = 50

# g = 1..n; the newest old run is g = n, finished 31 days ago; the oldest 91 days ago.
OLD_SOURCE = """(
    SELECT g, statement_timestamp() - interval '31 days' - make_interval(secs => (%(n)s - g) * %(spacing)s) AS finished,
           (ARRAY['done', 'done', 'done', 'done', 'done', 'done', 'done', 'done', 'failed', 'cancelled'])[1 + g %% 10]
               AS status
    FROM generate_series(1, %(n)s) AS g
) s"""

OLD_ROWS = {
    # Ids computed from g, so that every 50th run can name the next one (it finishes after it) as its
    # parent in the same statement (the foreign key is checked at commit).
    "id": "md5(%(seed)s || g)::uuid",
    "parent_id": f"CASE WHEN g %% {FAMILY_EVERY} = 0 AND g < %(n)s THEN md5(%(seed)s || (g + 1))::uuid END",
    "tenant_id": "%(tenant)s::uuid",
    "kind": "'bench_steps'",
    "queue": f"'{OLD_QUEUE}'",
    "input": "jsonb_build_object('steps', 1, 'g', g)",
    "status": "status",
    "attempt": "1",
    "run_after": "finished - interval '5 seconds'",
    "claimed_at": "finished - interval '4 seconds'",
    "running_seconds": "1",
    "expires_at": "finished + interval '7 days'",
    "result": "CASE WHEN status = 'done' THEN jsonb_build_object('steps', 1) END",
    "error": "CASE WHEN status = 'failed' THEN 'the CRM answered 422: field email is invalid' ELSE '' END",
    "error_kind": "CASE WHEN status = 'failed' THEN 'fatal' ELSE '' END",
    "request_hash": "md5(g::text)",
    "last_event_seq": "3",
    "current_step": "'s1'",
    "steps_done": "1",
    "steps_total": "1",
    "started_at": "finished - interval '4 seconds'",
    "finished_at": "finished",
    "created_at": "finished - interval '5 seconds'",
    "updated_at": "finished",
}


def fill(n: int, tenant) -> None:
    """The old runs, their steps and events, and the families; then VACUUM ANALYZE."""
    from runs.models import Event, Run, Step

    started = time.perf_counter()
    insert_select(
        Run,
        dict(OLD_ROWS),
        OLD_SOURCE,
        {
            "n": n,
            "spacing": 60 * 24 * 3600 / n,
            "tenant": tenant.pk,
            "seed": f"bench-retention-{os.getpid()}-",
        },
    )
    children = sql("SELECT count(*) FROM runs_run WHERE parent_id IS NOT NULL")[0][0]
    say(
        f"  runs      {n:>10,} in {time.perf_counter() - started:5.1f} s ({children:,} of them children)"
    )

    started = time.perf_counter()
    insert_select(
        Step,
        {
            "run_id": "r.id",
            "seq": "1",
            "name": "'s1'",
            "kind": "'custom'",
            "input": "'[0]'::jsonb",
            "output": "jsonb_build_object('i', 0)",
            "status": "'done'",
            "executions": "1",
            "started_at": "r.started_at",
            "ended_at": "r.finished_at",
        },
        "runs_run r WHERE r.queue = %(q)s",
        {"q": OLD_QUEUE},
    )
    say(f"  steps     {n:>10,} in {time.perf_counter() - started:5.1f} s")

    started = time.perf_counter()
    insert_select(
        Event,
        {
            "run_id": "r.id",
            "seq": "e.seq",
            "type": "CASE e.seq WHEN 1 THEN 'run.queued' WHEN 2 THEN 'step.done' ELSE 'run.' || r.status END",
            "actor_type": "CASE WHEN e.seq = 1 THEN 'api_key' ELSE 'worker' END",
            "payload": "jsonb_build_object('seq', e.seq)",
            "created_at": "r.created_at + make_interval(secs => e.seq)",
        },
        "runs_run r CROSS JOIN generate_series(1, 3) AS e(seq) WHERE r.queue = %(q)s",
        {"q": OLD_QUEUE},
    )
    say(f"  events    {3 * n:>10,} in {time.perf_counter() - started:5.1f} s")

    started = time.perf_counter()
    for table in ("runs_run", "runs_step", "runs_event", "runs_tenant"):
        sql(f"VACUUM ANALYZE {table}")
    say(f"  VACUUM ANALYZE in {time.perf_counter() - started:5.1f} s")


class Feeder(threading.Thread):
    """Submits one-step no-op runs at a steady rate, one transaction each, as an API server would."""

    def __init__(self, tenant, rate: float):
        super().__init__(daemon=True, name="feeder")
        self.tenant = tenant
        self.rate = rate
        self.stopping = threading.Event()
        self.submitted = 0
        self.behind = 0  # ticks missed because a submit took longer than 1/rate

    def run(self) -> None:
        from django.db import connection

        from runs.services import submit_run

        try:
            next_at = time.perf_counter()
            while not self.stopping.is_set():
                submit_run(
                    tenant=self.tenant, kind="bench_steps", input={"steps": 1}, queue=FRESH_QUEUE
                )
                self.submitted += 1
                next_at += 1 / self.rate
                delay = next_at - time.perf_counter()
                if delay > 0:
                    self.stopping.wait(delay)
                elif delay < -1.0:  # more than a second behind: keep the rate, don't burst
                    self.behind += 1
                    next_at = time.perf_counter()
        finally:
            connection.close()


class TimedBatches:
    """Wraps ``runs.engine.retention.prune_finished`` to record each batch's statement time (its transaction)."""

    def __init__(self):
        from runs.engine import retention

        self.module = retention
        self.original = retention.prune_finished
        self.times: list[float] = []
        self.runs = 0
        self.files = 0

    def __enter__(self):
        def timed(**kwargs):
            started = time.perf_counter()
            batch = self.original(**kwargs)
            self.times.append(time.perf_counter() - started)
            self.runs += batch.runs
            return batch

        self.module.prune_finished = timed
        return self

    def __exit__(self, *exc):
        self.module.prune_finished = self.original


def db_now():
    return sql("SELECT statement_timestamp()")[0][0]


def explain_one_batch() -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of one retention batch at the defaults, rolled back."""
    from django.conf import settings
    from django.db import connection, transaction

    from runs.queries import queries

    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS) " + queries.prune_finished,
            {
                "before": None,
                "age": settings.RUNS_RETENTION_DAYS * 86400.0,
                "give_up": settings.RUNS_WEBHOOK_GIVE_UP_SECONDS,
                "batch": settings.RUNS_RETENTION_BATCH,
            },
        )
        lines = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return lines


def window_figures(t0, t1) -> dict:
    """Fresh runs claimed in [t0, t1): claim latency p50/p95/max (ms); finished in it: the drain rate."""
    row = sql(
        "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY l), percentile_cont(0.95) WITHIN GROUP (ORDER BY l),"
        " max(l) FROM (SELECT EXTRACT(EPOCH FROM claimed_at - run_after) * 1000 AS l FROM runs_run"
        " WHERE queue = %(q)s AND claimed_at >= %(t0)s AND claimed_at < %(t1)s) x",
        {"q": FRESH_QUEUE, "t0": t0, "t1": t1},
    )[0]
    done = sql(
        "SELECT count(*) FROM runs_run WHERE queue = %(q)s AND finished_at >= %(t0)s AND finished_at < %(t1)s",
        {"q": FRESH_QUEUE, "t0": t0, "t1": t1},
    )[0][0]
    seconds = (t1 - t0).total_seconds()
    return {
        "claimed": row[0],
        "p50": row[1],
        "p95": row[2],
        "max": row[3],
        "drained_s": done / seconds,
        "seconds": seconds,
    }


def ms(value) -> str:
    return "    -" if value is None else f"{value:5.1f}"


def run(args, db) -> None:
    from django.conf import settings

    from runs.models import Run, Tenant, Worker
    from workers.reaper import Reaper

    tenant = Tenant.objects.create(
        name="Retention", slug="bench-retention", max_running=1000, max_queued=10_000_000
    )
    say()
    say(
        f"fill: {args.runs:,} finished runs older than the cutoff ({settings.RUNS_RETENTION_DAYS:g} days)"
    )
    fill(args.runs, tenant)
    sizes = sql(
        "SELECT relname, pg_size_pretty(pg_total_relation_size(relid)) FROM pg_stat_user_tables"
        " WHERE relname IN ('runs_run', 'runs_step', 'runs_event') ORDER BY relname"
    )
    say("  sizes: " + ", ".join(f"{name} {size}" for name, size in sizes))
    say()
    say("one retention batch on the full table, EXPLAIN (ANALYZE, BUFFERS), rolled back:")
    for line in explain_one_batch():
        say("    " + line)

    env = os.environ.copy() | {"PYTHONUNBUFFERED": "1", "RUNS_CONCURRENCY": str(args.concurrency)}
    logdir = Path(f"/tmp/bench-retention-{os.getpid()}")
    logdir.mkdir(exist_ok=True)
    workers = []
    for i in range(2):
        with open(logdir / f"worker-{i}.log", "wb") as log:
            workers.append(
                subprocess.Popen(
                    [
                        PY,
                        MANAGE,
                        "runworker",
                        "--queues",
                        FRESH_QUEUE,
                        "--concurrency",
                        str(args.concurrency),
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    # Two threads at half the rate each: a submit mostly waits for the database.
    feeders = [Feeder(tenant, args.rate / 2) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while Worker.objects.filter(stopped_at__isnull=True).count() < 2:
            if time.monotonic() > deadline or any(w.poll() is not None for w in workers):
                raise RuntimeError(f"the workers did not start; see {logdir}")
            time.sleep(0.2)
        say()
        say(
            f"load: {args.rate:g} runs/s submitted (one-step no-op bench_steps), 2 runworker processes x concurrency "
            f"{args.concurrency}; workers' logs in {logdir}"
        )
        for feeder in feeders:
            feeder.start()
        time.sleep(args.warmup)

        phases = []
        t0 = db_now()
        time.sleep(args.seconds)
        phases.append(("before", t0, db_now(), None))

        reaper = Reaper()
        t0 = db_now()
        started = time.perf_counter()
        passes = 0
        with TimedBatches() as batches:
            while True:
                passes += 1
                if reaper.prune() == 0:
                    break
        prune_wall = time.perf_counter() - started
        phases.append(("during", t0, db_now(), batches))

        t0 = db_now()
        time.sleep(args.seconds)
        phases.append(("after", t0, db_now(), None))
    finally:
        for feeder in feeders:
            feeder.stopping.set()
        for feeder in feeders:
            feeder.join(10)
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(30)
            except subprocess.TimeoutExpired:
                w.kill()
                w.wait(10)

    old_left = Run.objects.filter(queue=OLD_QUEUE).count()
    fresh = Run.objects.filter(queue=FRESH_QUEUE).count()
    steps, events = sql(
        "SELECT (SELECT count(*) FROM runs_step), (SELECT count(*) FROM runs_event)"
    )[0]
    submitted = sum(f.submitted for f in feeders)
    behind = sum(f.behind for f in feeders)
    say()
    say(
        f"verify: old runs left {old_left:,} of {args.runs:,}; fresh runs kept {fresh:,} of {submitted:,} "
        f"submitted -> {'OK' if old_left == 0 and fresh == submitted else 'WRONG'}; steps and events left "
        f"(the fresh runs'): {steps:,} and {events:,}"
        + (f"; the feeders fell more than a second behind {behind} times" if behind else "")
    )

    batches = phases[1][3]
    say(
        f"pruning: {batches.runs:,} runs in {prune_wall:.1f} s ({batches.runs / prune_wall:,.0f} runs/s) in "
        f"{passes} passes of at most {settings.RUNS_RETENTION_MAX_SECONDS:g} s, {len(batches.times)} batches of "
        f"{settings.RUNS_RETENTION_BATCH} with {settings.RUNS_RETENTION_PAUSE_SECONDS * 1000:g} ms pauses; "
        f"one batch's transaction p50 {pct(batches.times, 50) * 1000:.0f} ms, "
        f"p95 {pct(batches.times, 95) * 1000:.0f} ms, max {max(batches.times) * 1000:.0f} ms"
    )
    tenths = [
        batches.times[i * len(batches.times) // 10 : (i + 1) * len(batches.times) // 10]
        for i in range(10)
    ]
    say(
        "         batch transaction p50 by tenth of the prune (ms): "
        + " ".join(f"{pct(t, 50) * 1000:.0f}" for t in tenths if t)
    )
    duty = settings.RUNS_RETENTION_MAX_SECONDS / settings.RUNS_RETENTION_INTERVAL_SECONDS
    say(
        f"         at one pass every {settings.RUNS_RETENTION_INTERVAL_SECONDS:g} s, a reaper deletes about "
        f"{batches.runs / prune_wall * duty * 3600:,.0f} runs an hour once it has a backlog like this one"
    )

    say()
    say(f"claim latency (submit -> claimed, DB clock) per {args.window:g}-second window:")
    say(
        f"  {'phase':<7} {'window':>7} {'claimed':>8} {'p50 ms':>7} {'p95 ms':>7} {'max ms':>7} {'drained/s':>10}"
    )
    for name, t0, t1, _ in phases:
        start = t0
        while (t1 - start).total_seconds() > 1:  # a last sliver of a window says nothing
            end = min(t1, start + timedelta(seconds=args.window))
            f = window_figures(start, end)
            say(
                f"  {name:<7} {(start - t0).total_seconds():6.0f}s {f['claimed']:>8} {ms(f['p50']):>7} "
                f"{ms(f['p95']):>7} {ms(f['max']):>7} {f['drained_s']:>10.1f}"
            )
            start = end

    say()
    say("summary:")
    say(
        f"  {'phase':<7} {'seconds':>8} {'runs/s drained':>15} {'claim p50 ms':>13} {'claim p95 ms':>13} "
        f"{'runs pruned/s':>14}"
    )
    for name, t0, t1, timed in phases:
        f = window_figures(t0, t1)
        pruned = f"{timed.runs / f['seconds']:,.0f}" if timed else "0"
        say(
            f"  {name:<7} {f['seconds']:>8.1f} {f['drained_s']:>15.1f} {ms(f['p50']):>13} {ms(f['p95']):>13} "
            f"{pruned:>14}"
        )
    say(f"  total prune time for {args.runs:,} runs: {prune_wall:.1f} s")
    one, five, _ = os.getloadavg()
    say(f"  (load average at the end {one:.2f} {five:.2f} on {os.cpu_count()} CPUs)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=1_000_000, help="old finished runs to prune (default 1000000)"
    )
    parser.add_argument(
        "--rate", type=float, default=25, help="fresh runs submitted per second (default 25)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=4, help="runs in flight per worker (default 4)"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=30,
        help="length of the before and after phases (default 30)",
    )
    parser.add_argument(
        "--warmup", type=float, default=5, help="seconds of load before measuring (default 5)"
    )
    parser.add_argument(
        "--window", type=float, default=30, help="seconds per latency window (default 30)"
    )
    args = parser.parse_args(argv)
    if args.runs < FAMILY_EVERY or args.rate <= 0 or args.seconds <= 0 or args.window <= 0:
        parser.error(
            f"--runs must be at least {FAMILY_EVERY}, and --rate, --seconds and --window positive"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through the finally blocks, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    db = Database(agent_modules="bench.agents")
    try:
        db.setup()
        say("=" * 78)
        say("agentruns retention benchmark: pruning old runs under a steady load")
        say("=" * 78)
        say(f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL (.data/pg)'}")
        say(f"PostgreSQL : {db.version}")
        autovacuum = sql("SHOW autovacuum")[0][0]
        say(
            "settings   : "
            + ", ".join(f"{k}={v}" for k, v in sorted(db.settings.items()))
            + f", autovacuum={autovacuum}"
        )
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        one, five, _ = os.getloadavg()
        say(
            f"machine    : {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {one:.2f} {five:.2f}"
        )
        run(args, db)
        return 0
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
