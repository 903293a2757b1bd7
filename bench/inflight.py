"""Runs in flight benchmark: does ``runworker --concurrency N`` keep N runs in flight?

    .venv/bin/python bench/inflight.py                         # 1,000 runs, one 2 s step each, concurrency 500
    .venv/bin/python bench/inflight.py --steps 2                # two 2 s steps per run
    .venv/bin/python bench/inflight.py --fast 1                 # a no-op step, then the 2 s step
    .venv/bin/python bench/inflight.py --sleep 0 --concurrency 5 --runs 5000   # 1-step no-op drain
    .venv/bin/python bench/inflight.py --py-spy 3              # also dump the worker's threads 3 s in
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/inflight.py

The issue's goal, at ``--concurrency 500`` with runs whose step blocks 2 s
(a slow model call): at least 400 runs in flight on average, at most 20
database connections in the worker process, its RSS at most 300 MB, and a
1-step no-op drain no slower than before. The figures are printed, never
asserted: the machine is shared.

Like the other benchmarks it uses DATABASE_URL or the embedded PostgreSQL
and works in a database ``bench_<pid>`` of its own, dropped at the end. One
tenant (max_running 10,000) gets ``--runs`` runs of ``bench_slow``
(bench/agents.py, queue ``bench_slow``: ``--fast`` no-op steps, then
``--steps`` steps that sleep ``--sleep`` seconds) through submit_run; then ONE
``manage.py runworker --burst --queues bench_slow --concurrency C`` drains
them. While it does, every ``--interval`` seconds (default 0.1) the bench
samples, on a connection of its own:

* the runs in ``running`` (claimed; their step may not have started);
* the worker's database connections: backends of the bench database whose
  application_name is ``agentruns runworker`` (config/settings.py), by
  state (active, idle, idle in transaction);
* the worker's RSS (VmRSS) and thread count from /proc/<pid>/status.

Steps executing is measured exactly afterwards: each step returns the wall
clock times it started and ended, so the bench counts at each sample time
how many steps were inside their sleep. Its time average over the drain
(the sum of step durations divided by the span from first start to last
end) is the figure the goal speaks of. Every run is verified ``done`` with
all its steps.

For the 1-step no-op drain of bench/engine.py (two workers, concurrency 10),
compare before and after a change with:

    .venv/bin/python bench/engine.py --phases throughput --concurrency , --extra 1:10:1 --runs 5000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, pct, say, sql  # noqa: E402

KIND = "bench_slow"
QUEUE = "bench_slow"
APPLICATION_NAME = "agentruns runworker"  # config/settings.py: "agentruns <command>"
GOAL_IN_FLIGHT = 400
GOAL_CONNECTIONS = 20
GOAL_RSS_MB = 300


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds a process used so far (all its threads), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (float(fields[11]) + float(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> tuple[float, int] | None:
    """(VmRSS in MB, threads) of a live process, from /proc (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
    except OSError:
        return None
    rss_kb = int(fields.get("VmRSS", "0 kB").split()[0])
    return rss_kb / 1024, int(fields.get("Threads", "0").strip())


class Sampler:
    """Samples running runs, the worker's connections, RSS and threads every ``interval`` seconds."""

    def __init__(self, url: str, pid: int, interval: float) -> None:
        self.url = url
        self.pid = pid
        self.interval = interval
        self.samples: list[dict] = []
        self.worker_cpu = 0.0
        self.backend_cpu: dict[
            int, float
        ] = {}  # the worker's backends: the last CPU reading of each
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        import psycopg

        with psycopg.connect(
            self.url, autocommit=True, application_name="bench inflight sampler"
        ) as conn:
            while not self._stop.is_set():
                started = time.time()
                running = conn.execute(
                    "SELECT count(*) FROM runs_run WHERE status = 'running'"
                ).fetchone()[0]
                backends = conn.execute(
                    "SELECT pid, coalesce(state, '?') FROM pg_stat_activity"
                    " WHERE datname = current_database() AND application_name = %s"
                    " AND backend_type = 'client backend'",
                    [APPLICATION_NAME],
                ).fetchall()
                states = dict(Counter(state for _, state in backends))
                for backend, _ in backends:
                    used = cpu_seconds(backend)
                    if used is not None:
                        self.backend_cpu[backend] = used
                status = proc_status(self.pid)
                used = cpu_seconds(self.pid)
                if used is not None:
                    self.worker_cpu = used
                self.samples.append(
                    {
                        "t": started,
                        "running": running,
                        "connections": sum(states.values()),
                        "states": states,
                        "rss_mb": status[0] if status else None,
                        "threads": status[1] if status else None,
                    }
                )
                self._stop.wait(max(0.0, self.interval - (time.time() - started)))


def py_spy_summary(pid: int) -> list[str]:
    """Where the worker's threads are: ``py-spy dump``, each thread named by its innermost
    engine frame (workers/, runs/, config/, bench/) and its innermost frame of all."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists() and not shutil.which(exe):
        return ["(py-spy is not installed: .venv/bin/pip install py-spy)"]
    try:
        out = subprocess.run(
            [exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return [f"(py-spy failed: {exc})"]
    if out.returncode != 0:
        return [f"(py-spy failed: {out.stderr.strip()[:300]})"]
    threads: list[list[str]] = []
    for line in out.stdout.splitlines():
        if line.startswith("Thread "):
            threads.append([])
        elif threads and line.startswith("    ") and line.strip():
            threads[-1].append(line.strip())
    places: Counter[str] = Counter()
    for frames in threads:
        if not frames:
            continue
        engine = next(
            (
                f
                for f in frames
                if any(
                    f"({d}/" in f or f"/{d}/" in f for d in ("workers", "runs", "config", "bench")
                )
            ),
            "(no engine frame)",
        )
        places[f"{_frame(frames[0])}  <-  {_frame(engine)}"] += 1
    lines = [f"{len(threads)} threads; innermost frame  <-  innermost engine frame:"]
    lines += [f"  {n:4d}  {place}" for place, n in places.most_common(15)]
    return lines


def _frame(line: str) -> str:
    # "wait (threading.py:359)" or "_call (/x/workers/context.py:420)" -> "wait threading.py:359"
    name, _, where = line.partition(" (")
    return f"{name} {Path(where.rstrip(')')).name}"


def step_intervals() -> list[tuple[float, float]]:
    rows = sql("SELECT output FROM runs_step WHERE status = 'done' AND name LIKE 'slow%%'")
    spans = []
    for (output,) in rows:
        value = json.loads(output) if isinstance(output, str | bytes) else output
        spans.append((float(value["t0"]), float(value["t1"])))
    return spans


def latencies() -> tuple[list[float], list[float]]:
    """Per run, in seconds: claim -> its first slow step began; its last slow step ended -> the run done."""
    rows = sql(
        "SELECT EXTRACT(EPOCH FROM r.claimed_at)::float8, EXTRACT(EPOCH FROM r.finished_at)::float8,"
        " (array_agg(s.output ORDER BY s.seq))[1], (array_agg(s.output ORDER BY s.seq DESC))[1]"
        " FROM runs_run r JOIN runs_step s ON s.run_id = r.id AND s.name LIKE 'slow%%'"
        " WHERE r.status = 'done' GROUP BY r.id"
    )
    to_step, to_done = [], []
    for claimed, finished, first, last in rows:
        first = json.loads(first) if isinstance(first, str | bytes) else first
        last = json.loads(last) if isinstance(last, str | bytes) else last
        to_step.append(float(first["t0"]) - claimed)
        to_done.append(finished - float(last["t1"]))
    return to_step, to_done


def executing_at(spans: list[tuple[float, float]], times: list[float]) -> list[int]:
    """How many steps were inside their function at each of ``times`` (a sweep over sorted edges)."""
    starts = sorted(s for s, _ in spans)
    ends = sorted(e for _, e in spans)
    counts, i, j = [], 0, 0
    for t in sorted(times):
        while i < len(starts) and starts[i] <= t:
            i += 1
        while j < len(ends) and ends[j] <= t:
            j += 1
        counts.append(i - j)
    return counts


def run(args, db: Database) -> dict:
    from django.db import transaction

    from runs.services import submit_run
    from runs.tenants import ensure_tenant

    tenant, _ = ensure_tenant(
        slug="bench-inflight", max_running=args.max_running, max_queued=10_000_000
    )
    started = time.perf_counter()
    with transaction.atomic():
        for _ in range(args.runs):
            submit_run(
                tenant=tenant,
                kind=KIND,
                input={"sleep": args.sleep, "steps": args.steps, "fast": args.fast},
                queue=QUEUE,
            )
    say(
        f"enqueued {args.runs:,} runs via submit_run in one transaction in {time.perf_counter() - started:.2f} s"
    )
    sql("ANALYZE runs_run")
    sql("ANALYZE runs_tenant")

    env = os.environ.copy()
    env.pop(
        "RUNS_APPLICATION_NAME", None
    )  # the sampler finds the worker's backends by the default name
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["AGENT_MODULES"] = "bench.agents"
    logdir = Path(tempfile.mkdtemp(prefix="bench-inflight-"))
    log_path = logdir / "runworker.log"
    argv = [
        sys.executable,
        str(ROOT / "manage.py"),
        "runworker",
        "--burst",
        "--queues",
        QUEUE,
        "--concurrency",
        str(args.concurrency),
    ]
    say(f"worker     : {' '.join(argv[1:])}  (log {log_path})")
    with open(log_path, "wb") as log:
        t0 = time.time()
        worker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    sampler = Sampler(os.environ["DATABASE_URL"], worker.pid, args.interval)
    sampler.start()
    dump: list[str] = []
    timed_out = False
    try:
        if args.py_spy is not None:
            try:
                worker.wait(args.py_spy)
            except subprocess.TimeoutExpired:
                dump = py_spy_summary(worker.pid)
        limit = args.timeout or max(
            120.0, 10 * (args.runs / args.concurrency) * max(args.sleep, 0.01) * args.steps
        )
        try:
            worker.wait(max(0.1, limit - (time.time() - t0)))
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        wall = time.time() - t0
        sampler.stop()
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)

    # Verify.
    statuses = dict(sql("SELECT status, count(*) FROM runs_run GROUP BY status"))
    complete = sql(
        "SELECT count(*) FROM runs_run WHERE status = 'done' AND steps_done = %(k)s AND attempt = 1",
        {"k": args.steps + args.fast},
    )[0][0]
    fast_done = sql("SELECT count(*) FROM runs_step WHERE status = 'done' AND name LIKE 'fast%%'")[
        0
    ][0]
    spans = step_intervals()
    running_left = sql("SELECT running FROM runs_tenant WHERE id = %(t)s", {"t": tenant.pk})[0][0]
    ok = (
        complete == args.runs
        and len(spans) == args.runs * args.steps
        and fast_done == args.runs * args.fast
        and not timed_out
        and worker.returncode == 0
    )
    log_text = log_path.read_text(errors="replace")
    problems = {
        label: log_text.count(needle)
        for label, needle in (
            ("pool timeouts", "PoolTimeout"),
            ("executor crashed", "executor crashed"),
            ("claim failed", "claim failed"),
            ("lease lost", "lease lost"),
            ("tracebacks", "Traceback"),
        )
    }

    # Figures.
    first_claim = min((s for s, _ in spans), default=t0)
    last_end = max((e for _, e in spans), default=t0)
    active = max(last_end - first_claim, 1e-9)
    busy = sum(e - s for s, e in spans)
    during = [s for s in sampler.samples if first_claim <= s["t"] <= last_end] or sampler.samples
    executing = executing_at(spans, [s["t"] for s in during])
    running = [s["running"] for s in during]
    connections = [s["connections"] for s in sampler.samples]
    rss = [s["rss_mb"] for s in sampler.samples if s["rss_mb"] is not None]
    threads = [s["threads"] for s in sampler.samples if s["threads"] is not None]
    waves = math.ceil(args.runs / args.concurrency)
    ideal = waves * args.steps * args.sleep
    peak_states: dict = (
        max(sampler.samples, key=lambda s: s["connections"])["states"] if sampler.samples else {}
    )

    say()
    say(
        f"verify     : statuses {statuses}; done with {args.fast + args.steps} step(s) and attempt 1: "
        f"{complete}/{args.runs}; slow steps done {len(spans)}/{args.runs * args.steps}, no-op steps done "
        f"{fast_done}/{args.runs * args.fast}; tenant running left {running_left}; "
        f"worker exit code {worker.returncode}{'; TIMED OUT' if timed_out else ''} -> {'OK' if ok else 'FAILED'}"
    )
    say("worker log : " + ", ".join(f"{k} x{v}" for k, v in problems.items()))
    if not ok:
        say("  --- worker log tail ---")
        say("\n".join(log_text.splitlines()[-30:]))
        say("  (the figures below are NOT valid: the runs were not all processed)")
    say(
        f"drain      : {wall:.2f} s from starting the worker to its exit; ideal {ideal:.2f} s "
        f"({waves} wave(s) of {args.concurrency} x {args.steps} step(s) x {args.sleep:g} s, start-up aside)"
    )
    say(
        f"             first step began {first_claim - t0:.2f} s after the start, the last ended at {last_end - t0:.2f} s"
        f" -> {args.runs / active:.0f} runs/s, {args.runs * args.steps / active:.0f} steps/s over the active span"
    )
    say(
        f"in flight  : steps executing, time average over the active span {busy / active:.1f} "
        f"(sum of step durations {busy:.1f} s / {active:.2f} s); sampled every {args.interval:g} s: "
        f"mean {sum(executing) / max(len(executing), 1):.1f}, p50 {pct(executing, 50) if executing else 0}, "
        f"max {max(executing, default=0)}"
    )
    if running:
        say(
            f"             runs in status running (claimed): mean {sum(running) / len(running):.1f}, "
            f"p50 {pct(running, 50)}, max {max(running)}"
        )
    if connections:
        say(
            f"connections: worker backends (application_name {APPLICATION_NAME!r}) max {max(connections)}, "
            f"p50 {pct(connections, 50)}; at the peak {peak_states}"
        )
    to_step, to_done = latencies()
    if to_step:
        say(
            f"latency    : claim -> first slow step began p50 {pct(to_step, 50) * 1000:.0f} ms, p90 "
            f"{pct(to_step, 90) * 1000:.0f}, max {max(to_step) * 1000:.0f}; last slow step ended -> run done "
            f"p50 {pct(to_done, 50) * 1000:.0f} ms, p90 {pct(to_done, 90) * 1000:.0f}, max {max(to_done) * 1000:.0f}"
        )
    say(
        f"CPU        : the worker process {sampler.worker_cpu:.1f} s, its PostgreSQL backends "
        f"{sum(sampler.backend_cpu.values()):.1f} s ({len(sampler.backend_cpu)} backends), over {wall:.1f} s of wall "
        f"time on {os.cpu_count()} CPUs -> {sampler.worker_cpu / args.runs * 1000:.2f} + "
        f"{sum(sampler.backend_cpu.values()) / args.runs * 1000:.2f} ms per run"
    )
    if rss:
        say(
            f"memory     : worker VmRSS max {max(rss):.0f} MB, at the end {rss[-1]:.0f} MB; threads max {max(threads)}"
        )
    if args.timeline:
        say(
            "timeline   : seconds after the worker's start: steps executing / runs running / connections / RSS MB"
        )
        all_executing = executing_at(spans, [s["t"] for s in sampler.samples])
        next_t = 0.0
        row = []
        for sample, n in zip(sampler.samples, all_executing, strict=True):
            if sample["t"] - t0 >= next_t:
                row.append(
                    f"{sample['t'] - t0:5.1f}s {n:4d}/{sample['running']:4d}/{sample['connections']:2d}/"
                    f"{sample['rss_mb'] or 0:3.0f}"
                )
                next_t += args.timeline
        for i in range(0, len(row), 4):
            say("  " + "   ".join(row[i : i + 4]))
    if dump:
        say(f"py-spy     : the worker's threads {args.py_spy:g} s after its start")
        for line in dump:
            say("  " + line)
    mean_in_flight = busy / active
    say()
    say(
        f"goal       : >= {GOAL_IN_FLIGHT} in flight on average (at concurrency 500): {mean_in_flight:.0f}; "
        f"<= {GOAL_CONNECTIONS} connections: {max(connections, default=0)}; <= {GOAL_RSS_MB} MB RSS: "
        f"{max(rss, default=0):.0f} MB   (printed, not asserted)"
    )
    return {"ok": ok}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=1000, help="runs to drain (default 1000)")
    parser.add_argument(
        "--sleep", type=float, default=2.0, help="seconds each step sleeps (default 2; 0 = no-op)"
    )
    parser.add_argument("--steps", type=int, default=1, help="steps per run (default 1)")
    parser.add_argument(
        "--fast", type=int, default=0, help="no-op steps before the slow ones (default 0)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=500, help="runworker --concurrency (default 500)"
    )
    parser.add_argument(
        "--max-running", type=int, default=10_000, help="the tenant's max_running (default 10000)"
    )
    parser.add_argument(
        "--interval", type=float, default=0.1, help="sampling interval in seconds (default 0.1)"
    )
    parser.add_argument(
        "--py-spy",
        type=float,
        default=None,
        metavar="SECONDS",
        help="run `py-spy dump` on the worker this long after its start and summarise its threads",
    )
    parser.add_argument(
        "--timeline",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also print the samples every SECONDS (steps executing, running, connections, RSS)",
    )
    parser.add_argument(
        "--timeout", type=float, default=None, help="give up on the drain after this many seconds"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.concurrency < 1 or args.sleep < 0 or args.fast < 0:
        parser.error(
            "--runs, --steps and --concurrency must be at least 1, --sleep and --fast at least 0"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through the finally block, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    db = Database(agent_modules="bench.agents")
    try:
        db.setup()
        say("=" * 78)
        say("agentruns runs-in-flight benchmark")
        say("=" * 78)
        say(f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL (.data/pg)'}")
        say(f"PostgreSQL : {db.version}")
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        one, five, _ = os.getloadavg()
        say(
            f"machine    : {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load {one:.2f} {five:.2f}"
        )
        say(
            f"runs       : {args.runs:,} of {KIND}, {args.fast} no-op step(s) then {args.steps} step(s) of "
            f"{args.sleep:g} s each, "
            f"one worker at concurrency {args.concurrency}"
        )
        pool = {
            k: os.environ.get(k)
            for k in ("RUNS_DB_POOL", "RUNS_DB_POOL_MAX", "RUNS_DB_POOL_TIMEOUT")
            if os.environ.get(k)
        }
        if pool:
            say(f"pool env   : {pool}")
        result = run(args, db)
        return 0 if result["ok"] else 1
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
