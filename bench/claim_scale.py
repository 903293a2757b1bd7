"""Claim latency at scale, and heartbeat cost versus runs held.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/claim_scale.py
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/claim_scale.py --quick
    .venv/bin/python bench/claim_scale.py --finished 300000 --queued 30000 --iterations 100 --held 1,10,100

Like bench/claim_isolation.py it uses DATABASE_URL or the embedded
PostgreSQL, and works in a database ``bench_<pid>`` of its own, dropped at
the end (also on an error, Ctrl-C or SIGTERM). Figures are printed, never
asserted; the machine's CPUs and load average are printed with them.

1. Claim latency at scale. ``runs.engine.claim.claim(...)`` exactly as a
   worker calls it (one statement in autocommit, so the commit is included;
   n=10, queue ``bench_tp``, kind ``bench_steps``), p50/p95/p99 over
   ``--iterations`` claims, in two states of the same database:

   - small: 1,000 finished runs (done) + 1,000 queued runs;
   - large: ``--finished`` finished (default 1,000,000) + ``--queued`` queued
     (default 100,000); ``--quick``: 100,000 + 10,000 and 50 iterations.

   The goal is large <= 2x small (p50 and p95). After each timed claim the
   runs are given back, untimed, with ``leave(Exit.release(...))``,
   so that each claim meets the same queue. Each state is one
   ``INSERT INTO runs_run ... SELECT ... FROM generate_series`` (every NOT
   NULL column filled as bench/retention.py's and bench/admin_million.py's
   rows are), then one step and three events per finished run (as
   bench/retention.py), then VACUUM (ANALYZE). In the large state the
   claim's plan is printed twice: EXPLAIN (ANALYZE, BUFFERS) of the same
   statement and parameters (rolled back; PostgreSQL plans it for these
   values), and the plan the worker's prepared statement really ran
   (auto_explain of one claim, rolled back; the engine's connections use
   plan_cache_mode=force_generic_plan).

2. Heartbeat cost versus runs held. One registered worker claims 1, 10,
   100, 1,000, 5,000 runs (``--held``, cumulatively, with claim(n=...)) and
   calls ``runs.engine.claim.heartbeat(...)`` (lease 300 s) ``--beats`` times
   at each size: latency p50/p95, the PostgreSQL backend's CPU per call
   (utime+stime of /proc/<pg_backend_pid()>/stat, and the more precise
   /proc/<pid>/schedstat), WAL bytes per call from pg_current_wal_lsn()
   (the whole server's WAL: other databases on the server write into it
   too) and from auto_explain of one heartbeat (that statement's own WAL,
   without its commit record). A size stops after ``--beat-seconds``
   (default 120) once 10 heartbeats are done. The statistics are those of
   the last VACUUM (ANALYZE), taken with no run running; then the plan of
   the largest heartbeat is printed, runs_run is analyzed again (with those
   runs running, as autovacuum eventually would) and the largest size is
   measured once more, with its plan.

The engine binds parameters on the server and prepares its statements
(prepare_threshold; plan_cache_mode=force_generic_plan), so what a worker
runs is a generic plan made once per connection. psycopg deallocates a
connection's prepared statements on any rollback: the list of prepared
statements is printed before the two rolled-back plans.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.admin_million import insert_select  # noqa: E402
from bench.common import Database, cpu_times, pct, say, sql  # noqa: E402

KIND = "bench_steps"  # bench/agents.py: claimed, never executed here
QUEUE = "bench_tp"
CLAIM_N = 10
LEASE = 300
SMALL_FINISHED = 1_000
SMALL_QUEUED = 1_000
GOAL_RATIO = 2.0
TABLES = ("runs_run", "runs_step", "runs_event", "runs_tenant")

# g = 1..finished + queued: the first ``finished`` rows are done (finished over
# the last 30 days, the newest an hour ago), the others queued (submitted over
# the last ``queued`` seconds, priorities cycling 0-9).
SOURCE = """(
    SELECT g, g <= %(finished)s AS finished,
           CASE WHEN g <= %(finished)s
                THEN statement_timestamp() - interval '1 hour'
                     - make_interval(secs => (%(finished)s - g) * %(spacing)s)
                ELSE statement_timestamp() - make_interval(secs => g - %(finished)s)
           END AS created
    FROM generate_series(1, %(total)s) AS g
) s"""

ROWS = {
    "id": "gen_random_uuid()",
    "tenant_id": "%(tenant)s::uuid",
    "kind": "%(kind)s",
    "queue": "%(queue)s",
    "priority": "g %% 10",
    "input": "jsonb_build_object('steps', 1, 'g', g, 'fill', %(fill)s::text)",
    "status": "CASE WHEN finished THEN 'done' ELSE 'queued' END",
    "attempt": "CASE WHEN finished THEN 1 ELSE 0 END",
    "run_after": "created",
    "claimed_at": "CASE WHEN finished THEN created + interval '1 second' END",
    "running_seconds": "CASE WHEN finished THEN 1 ELSE 0 END",
    "expires_at": "created + interval '7 days'",
    "result": "CASE WHEN finished THEN jsonb_build_object('steps', 1) END",
    "request_hash": "md5(g::text)",
    "last_event_seq": "CASE WHEN finished THEN 3 ELSE 0 END",
    "current_step": "CASE WHEN finished THEN 's1' ELSE '' END",
    "steps_done": "CASE WHEN finished THEN 1 ELSE 0 END",
    "steps_total": "CASE WHEN finished THEN 1 END",
    "started_at": "CASE WHEN finished THEN created + interval '1 second' END",
    "finished_at": "CASE WHEN finished THEN created + interval '5 seconds' END",
    "created_at": "created",
    "updated_at": "CASE WHEN finished THEN created + interval '5 seconds' ELSE created END",
}


def kinds() -> dict[str, int]:
    from runs.registry import all_kinds

    versions = {k.name: k.version for k in all_kinds()}
    if KIND not in versions:
        raise RuntimeError(f"{KIND} is not registered: AGENT_MODULES must include bench.agents")
    return {KIND: versions[KIND]}


def fill(tenant, *, finished: int, queued: int, tag: str) -> None:
    """``finished`` done runs (one step, three events each) and ``queued`` queued runs; then VACUUM (ANALYZE)."""
    from runs.models import Event, Run, Step

    started = time.perf_counter()
    insert_select(
        Run,
        dict(ROWS),
        SOURCE,
        {
            "finished": finished,
            "total": finished + queued,
            "spacing": 30 * 24 * 3600 / max(finished, 1),
            "tenant": tenant.pk,
            "kind": KIND,
            "queue": QUEUE,
            "fill": tag,
        },
    )
    # What submit_run's after-commit counter would have done.
    sql(
        "UPDATE runs_tenant SET queued = queued + %(n)s WHERE id = %(tenant)s",
        {"n": queued, "tenant": tenant.pk},
    )
    say(
        f"  runs      {finished + queued:>10,} in {time.perf_counter() - started:6.1f} s"
        f" ({finished:,} done, {queued:,} queued)"
    )
    if finished:
        these = "r.status = 'done' AND r.input->>'fill' = %(fill)s"
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
            f"runs_run r WHERE {these}",
            {"fill": tag},
        )
        say(f"  steps     {finished:>10,} in {time.perf_counter() - started:6.1f} s")
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
            f"runs_run r CROSS JOIN generate_series(1, 3) AS e(seq) WHERE {these}",
            {"fill": tag},
        )
        say(f"  events    {3 * finished:>10,} in {time.perf_counter() - started:6.1f} s")
    started = time.perf_counter()
    for table in TABLES:
        sql(f"VACUUM (ANALYZE) {table}")
    say(f"  VACUUM (ANALYZE) {', '.join(TABLES)} in {time.perf_counter() - started:6.1f} s")


def sizes() -> None:
    rows = sql(
        "SELECT c.relname, c.reltuples::bigint, pg_relation_size(c.oid), pg_indexes_size(c.oid),"
        " pg_total_relation_size(c.oid) FROM pg_class c WHERE c.relname = ANY(%(t)s) ORDER BY c.relname",
        {"t": list(TABLES)},
    )
    for name, tuples, heap, indexes, total in rows:
        say(
            f"  {name:<12} ~{max(tuples, 0):>10,} rows  heap {mb(heap):>9}  indexes {mb(indexes):>9}"
            f"  total {mb(total):>9}"
        )
    idx = sql(
        "SELECT pg_relation_size('run_claim_order_idx'), pg_relation_size('run_running_idx')"
    )[0]
    live = sql(
        "SELECT count(*) FILTER (WHERE status = 'queued'), count(*) FILTER (WHERE status = 'done'),"
        " count(*) FILTER (WHERE status = 'running') FROM runs_run"
    )[0]
    say(
        f"  run_claim_order_idx {mb(idx[0])}, run_running_idx {mb(idx[1])};"
        f" runs: {live[0]:,} queued, {live[1]:,} done, {live[2]:,} running"
    )


def mb(n: int) -> str:
    return f"{n / 1024 / 1024:.1f} MB"


def give_back(claimed) -> None:
    from runs.engine.exit import Exit, leave

    for run in claimed:
        exited = leave(Exit.release(reason="bench").of_run(run.id, run.lease_token))
        if exited is None or exited.status != "queued":
            raise RuntimeError(f"could not give run {run.id} back ({exited})")


def time_claims(label: str, *, iterations: int, worker_id, claim_kinds) -> dict:
    """``iterations`` timed claims of CLAIM_N (after a warm-up), each given back untimed."""
    from runs.engine import claim as claims

    warmup = max(10, iterations // 20)
    times = []
    busy0, total0 = cpu_times()
    load0 = os.getloadavg()[0]
    for i in range(warmup + iterations):
        started = time.perf_counter()
        claimed = claims.claim(
            worker_id=worker_id, queues=[QUEUE], kinds=claim_kinds, n=CLAIM_N, lease=LEASE
        )
        elapsed = (time.perf_counter() - started) * 1000
        if len(claimed) != CLAIM_N:
            raise RuntimeError(f"{label}: claimed {len(claimed)} runs, expected {CLAIM_N}")
        give_back(claimed)
        if i >= warmup:
            times.append(elapsed)
    busy1, total1 = cpu_times()
    figures = {
        "label": label,
        "p50": pct(times, 50),
        "p95": pct(times, 95),
        "p99": pct(times, 99),
        "max": max(times),
        "mean": sum(times) / len(times),
        "count": len(times),
        "busy": (busy1 - busy0) / (total1 - total0) * 100 if total1 > total0 else float("nan"),
        "load": (load0, os.getloadavg()[0]),
    }
    say(
        f"  {label:<6} claim n={CLAIM_N}: p50 {figures['p50']:6.2f}  p95 {figures['p95']:6.2f}"
        f"  p99 {figures['p99']:6.2f}  max {figures['max']:6.2f}  mean {figures['mean']:6.2f} ms"
        f"  ({figures['count']} claims after {warmup} warm-up; machine CPU busy {figures['busy']:.0f}%,"
        f" load {figures['load'][0]:.2f} -> {figures['load'][1]:.2f})"
    )
    return figures


def explain_claim(worker_id, claim_kinds) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of claim()'s statement and parameters, through engine_cursor(), rolled back."""
    from django.db import connection, transaction

    from runs.db import engine_cursor
    from runs.engine import claim as claims
    from runs.queries import queries

    captured: dict = {}

    class Captured(Exception):
        pass

    def capture(execute, query, params, many, context):
        captured.update(sql=query, params=params)
        raise Captured

    with connection.execute_wrapper(capture):
        try:
            claims.claim(
                worker_id=worker_id, queues=[QUEUE], kinds=claim_kinds, n=CLAIM_N, lease=LEASE
            )
        except Captured:
            pass
    assert captured["sql"] == queries.claim
    with transaction.atomic(), engine_cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + captured["sql"], captured["params"])
        lines = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return lines


class AutoExplain:
    """auto_explain on this thread's Django connection: the plans of statements as they really ran.

    LOG messages go to the client (client_min_messages=log) and are kept here;
    the settings are reset on the way out.
    """

    def __init__(self, *, fmt: str = "text") -> None:
        self.fmt = fmt
        self.messages: list[str] = []

    def __enter__(self):
        from django.db import connection

        connection.ensure_connection()
        self.raw = connection.connection
        self.raw.add_notice_handler(self._notice)
        sql("LOAD 'auto_explain'")
        for setting, value in (
            ("auto_explain.log_min_duration", "0"),
            ("auto_explain.log_analyze", "on"),
            ("auto_explain.log_buffers", "on"),
            ("auto_explain.log_wal", "on"),
            ("auto_explain.log_timing", "on"),
            ("auto_explain.log_format", self.fmt),
            ("client_min_messages", "log"),
        ):
            sql("SELECT set_config(%(name)s, %(value)s, false)", {"name": setting, "value": value})
        self.messages.clear()  # the set_config calls themselves
        return self

    def _notice(self, diag) -> None:
        if diag.severity_nonlocalized == "LOG" and diag.message_primary:
            self.messages.append(diag.message_primary)

    def __exit__(self, *exc):
        self.raw.remove_notice_handler(self._notice)
        for setting in (
            "client_min_messages",
            "auto_explain.log_min_duration",
            "auto_explain.log_analyze",
            "auto_explain.log_buffers",
            "auto_explain.log_wal",
            "auto_explain.log_timing",
            "auto_explain.log_format",
        ):
            sql(f"RESET {setting}")

    def plans(self) -> list[str]:
        return [m for m in self.messages if "plan:" in m]


def plan_lines(message: str) -> list[str]:
    """An auto_explain text message without its Query Text: its first line, then the plan from its root node."""
    lines = message.splitlines()
    root = next((i for i, line in enumerate(lines) if line[:1].strip() and "(cost=" in line), 1)
    return lines[:1] + lines[root:]


def logged_claim_plan(worker_id, claim_kinds, *, fmt: str = "text") -> str | None:
    """The auto_explain message of one claim as the worker's statement ran it, in a transaction rolled back."""
    from django.db import transaction

    from runs.engine import claim as claims

    with AutoExplain(fmt=fmt) as log, transaction.atomic():
        got = claims.claim(
            worker_id=worker_id, queues=[QUEUE], kinds=claim_kinds, n=CLAIM_N, lease=LEASE
        )
        transaction.set_rollback(True)
    if len(got) != CLAIM_N:
        raise RuntimeError(f"auto_explain claim: {len(got)} runs")
    plans = [p for p in log.plans() if "claimed AS" in p]
    return plans[-1] if plans else None


def generic_claim_plan(worker_id, claim_kinds) -> list[str]:
    """The plan the worker's claim statement really ran (auto_explain, text), rolled back."""
    message = logged_claim_plan(worker_id, claim_kinds)
    return plan_lines(message) if message else ["(auto_explain logged no plan for the claim)"]


def claim_nodes(worker_id, claim_kinds) -> list[dict]:
    """The claim's plan nodes that read or write a table (auto_explain JSON of one claim, rolled back).

    Scans: time and shared buffers inclusive of their subplans; a ModifyTable: its own
    (its children's taken out), i.e. the rows' new versions and their index entries."""
    message = logged_claim_plan(worker_id, claim_kinds, fmt="json")
    if not message:
        return []
    doc = json.loads(message[message.index("{") :])
    nodes: list[dict] = []

    def buffers(node: dict) -> int:
        return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))

    def elapsed(node: dict) -> float:
        return float(node.get("Actual Total Time", 0.0)) * float(node.get("Actual Loops", 1) or 1)

    def walk(node: dict, depth: int, where: str) -> None:
        children = node.get("Plans", [])
        where = node.get("Subplan Name") or where
        if node.get("Node Type") == "ModifyTable" or node.get("Relation Name"):
            own = node.get("Node Type") == "ModifyTable"
            label = node.get("Operation", "") if own else node["Node Type"]
            if node.get("Index Name"):
                label += f" using {node['Index Name']}"
            label += f" on {node.get('Relation Name', '')} {node.get('Alias', '')}"
            nodes.append(
                {
                    "label": f"{where}: {label}" if where else label,
                    "loops": int(node.get("Actual Loops", 0)),
                    "rows": float(node.get("Actual Rows", 0)),
                    "buffers": buffers(node) - (sum(buffers(c) for c in children) if own else 0),
                    "ms": elapsed(node) - (sum(elapsed(c) for c in children) if own else 0.0),
                    "heap_fetches": node.get("Heap Fetches"),
                    "removed": int(node.get("Rows Removed by Filter", 0))
                    + int(node.get("Rows Removed by Index Recheck", 0)),
                }
            )
        for child in children:
            walk(child, depth + 1, where)

    walk(doc["Plan"], 0, "")
    return nodes


def compare_nodes(small: list[dict], large: list[dict]) -> None:
    """The claim's table-reading and -writing nodes, small state next to large state."""
    say(
        f"    {'node (CTE or subplan: node on relation alias)':<72} {'small: buf':>10} {'ms':>6} | {'large: buf':>10}"
        f" {'ms':>6} {'heap fetches':>13}"
    )
    labels = [n["label"] for n in small]
    if labels != [n["label"] for n in large]:
        say("    (the two states' plans differ in shape: nodes listed by position)")
    for i in range(max(len(small), len(large))):
        a = small[i] if i < len(small) else None
        b = large[i] if i < len(large) else None
        label = (b or a)["label"]
        left = f"{a['buffers']:>10} {a['ms']:6.3f}" if a else f"{'-':>10} {'-':>6}"
        right = f"{b['buffers']:>10} {b['ms']:6.3f}" if b else f"{'-':>10} {'-':>6}"
        fetches = "" if not b or b["heap_fetches"] is None else f"{b['heap_fetches']:>13}"
        say(f"    {label[:72]:<72} {left} | {right} {fetches}")


def prepared_statements() -> list[tuple]:
    return sql(
        "SELECT generic_plans, custom_plans, regexp_replace(left(statement, 200), '\\s+', ' ', 'g')"
        " FROM pg_prepared_statements ORDER BY generic_plans + custom_plans DESC"
    )


def backend_cpu(pid: int) -> tuple[float, float | None]:
    """(utime+stime in seconds from /proc/<pid>/stat, on-CPU seconds from /proc/<pid>/schedstat or None)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # fields 14 and 15 of the whole line
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            on_cpu = int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        on_cpu = None
    return ticks / os.sysconf("SC_CLK_TCK"), on_cpu


def wal_lsn() -> str:
    return sql("SELECT pg_current_wal_lsn()::text")[0][0]


def statement_wal(plan_json: str) -> tuple[int, int]:
    """(WAL bytes, WAL records) of the ModifyTable nodes of an auto_explain JSON plan."""
    start = plan_json.index("{")
    doc = json.loads(plan_json[start:])
    total_bytes = total_records = 0

    def walk(node: dict) -> None:
        nonlocal total_bytes, total_records
        if node.get("Node Type") == "ModifyTable":
            total_bytes += int(node.get("WAL Bytes", 0))
            total_records += int(node.get("WAL Records", 0))
            return  # inclusive of its children
        for child in node.get("Plans", []):
            walk(child)

    walk(doc["Plan"])
    return total_bytes, total_records


HEADER = (
    f"  {'held':>14} {'p50 ms':>8} {'p95 ms':>8} {'CPU ms/hb':>10} {'(schedstat)':>11} {'WAL B/hb':>10}"
    f" {'stmt WAL B':>10} | {'p50 us/run':>10} {'CPU us/run':>10} {'WAL B/run':>9}  beats"
)


def measure_heartbeats(args, worker_id, held: dict, label: str) -> dict:
    """Heartbeats of ``held``: a warm-up, then ``--beats`` timed ones (fewer past ``--beat-seconds``, never under
    10); the backend's CPU and the server's WAL around them; then one more under auto_explain (its own WAL)."""
    from runs.engine import claim as claims

    for _ in range(3):  # warm-up; the statement is prepared from its second execution
        claims.heartbeat(worker_id=worker_id, held=held, lease=LEASE)
    pid = sql("SELECT pg_backend_pid()")[0][0]
    cpu0, sched0 = backend_cpu(pid)
    lsn0 = wal_lsn()
    times: list[float] = []
    began = time.perf_counter()
    while len(times) < args.beats:
        started = time.perf_counter()
        kept = claims.heartbeat(worker_id=worker_id, held=held, lease=LEASE)
        times.append((time.perf_counter() - started) * 1000)
        if len(kept) != len(held):
            raise RuntimeError(f"heartbeat kept {len(kept)} of {len(held)} leases")
        if len(times) >= min(10, args.beats) and time.perf_counter() - began > args.beat_seconds:
            break
    lsn1 = wal_lsn()
    cpu1, sched1 = backend_cpu(pid)
    if sql("SELECT pg_backend_pid()")[0][0] != pid:
        raise RuntimeError("the Django connection changed backend during the heartbeats")
    wal = sql("SELECT pg_wal_lsn_diff(%(b)s::pg_lsn, %(a)s::pg_lsn)", {"a": lsn0, "b": lsn1})[0][0]
    with AutoExplain(fmt="json") as log:
        claims.heartbeat(worker_id=worker_id, held=held, lease=LEASE)
    plans = [p for p in log.plans() if "extended AS" in p or "renewed AS" in p]
    stmt_wal, stmt_records = statement_wal(plans[-1]) if plans else (0, 0)
    beats, n = len(times), len(held)
    row = {
        "label": label,
        "held": n,
        "beats": beats,
        "p50": pct(times, 50),
        "p95": pct(times, 95),
        "cpu_ms": (cpu1 - cpu0) * 1000 / beats,
        "sched_ms": None if sched0 is None else (sched1 - sched0) * 1000 / beats,
        "wal": float(wal) / beats,
        "stmt_wal": stmt_wal,
        "stmt_records": stmt_records,
        "pid": pid,
    }
    sched = "-" if row["sched_ms"] is None else f"{row['sched_ms']:.3f}"
    cpu_run = row["sched_ms"] if row["sched_ms"] is not None else row["cpu_ms"]
    say(
        f"  {label:>14} {row['p50']:8.2f} {row['p95']:8.2f} {row['cpu_ms']:10.2f} {sched:>11} {row['wal']:10,.0f}"
        f" {stmt_wal:10,} | {row['p50'] * 1000 / n:10.1f} {cpu_run * 1000 / n:10.1f}"
        f" {stmt_wal / n:9.0f}  {beats}"
    )
    return row


def heartbeat_plan(worker_id, held: dict) -> list[str]:
    """The plan one heartbeat really ran (auto_explain, text)."""
    from runs.engine import claim as claims

    with AutoExplain() as log:
        claims.heartbeat(worker_id=worker_id, held=held, lease=LEASE)
    plans = [p for p in log.plans() if "extended AS" in p or "renewed AS" in p]
    return plan_lines(plans[-1]) if plans else ["(auto_explain logged no plan for the heartbeat)"]


def heartbeats(args, tenant, claim_kinds) -> list[dict]:
    from runs.engine import claim as claims
    from runs.engine.fleet import register_worker

    worker_id = uuid.uuid4()
    register_worker(
        worker_id=worker_id, queues=[QUEUE], kinds=list(claim_kinds), concurrency=max(args.held)
    )
    held: dict[int, uuid.UUID] = {}
    results = []
    say(HEADER)
    for target in args.held:
        while len(held) < target:
            got = claims.claim(
                worker_id=worker_id,
                queues=[QUEUE],
                kinds=claim_kinds,
                n=min(target - len(held), 1000),
                lease=LEASE,
            )
            if not got:
                raise RuntimeError(f"nothing left to claim at {len(held)} held (want {target})")
            held.update({c.lease_token: c.id for c in got})
        results.append(measure_heartbeats(args, worker_id, held, f"{len(held):,}"))
    pid = results[-1]["pid"]
    say(
        f"  (backend {pid}; /proc/{pid}/stat counts CPU in {1000 / os.sysconf('SC_CLK_TCK'):.0f} ms ticks)"
    )
    running = sql("SELECT count(*) FROM runs_run WHERE status = 'running'")[0][0]
    estimate = sql("SELECT reltuples::bigint FROM pg_class WHERE relname = 'run_running_idx'")[0][0]
    say()
    say(
        f"  the plan of one heartbeat of {len(held):,} runs ({running:,} running in the table; the statistics,"
        f" from the last ANALYZE, say run_running_idx holds ~{max(estimate, 0):,}):"
    )
    for line in heartbeat_plan(worker_id, held):
        say("    " + line)
    say()
    say(
        f"  ANALYZE runs_run with the {running:,} runs running (as autovacuum would, eventually);"
        " the cached plans are planned again:"
    )
    sql("ANALYZE runs_run")
    say(HEADER)
    results.append(measure_heartbeats(args, worker_id, held, f"{len(held):,} analyzed"))
    say()
    say(f"  the plan of one heartbeat of {len(held):,} runs after that ANALYZE:")
    for line in heartbeat_plan(worker_id, held):
        say("    " + line)
    hot = sql(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'runs_run'"
    )[0]
    say(f"  (runs_run updates so far: {hot[0]:,}, of them HOT: {hot[1]:,})")
    return results


def run(args) -> None:
    from runs.models import Tenant

    claim_kinds = kinds()
    tenant = Tenant.objects.create(
        name="Claim scale", slug="bench-claim-scale", max_running=100_000, max_queued=100_000_000
    )
    worker_id = uuid.uuid4()

    say()
    say(
        f"1. claim latency at scale (claim n={CLAIM_N}, queue {QUEUE}, kind {KIND}, one tenant, autocommit)"
    )
    say()
    say(f"small state: {SMALL_FINISHED:,} done + {SMALL_QUEUED:,} queued")
    fill(tenant, finished=SMALL_FINISHED, queued=SMALL_QUEUED, tag="small")
    sizes()
    small = time_claims(
        "small", iterations=args.iterations, worker_id=worker_id, claim_kinds=claim_kinds
    )
    small_nodes = claim_nodes(worker_id, claim_kinds)

    say()
    say(
        f"large state: {args.finished:,} done + {args.queued:,} queued (adding"
        f" {args.finished - SMALL_FINISHED:,} + {args.queued - SMALL_QUEUED:,} to the same database)"
    )
    fill(
        tenant,
        finished=args.finished - SMALL_FINISHED,
        queued=args.queued - SMALL_QUEUED,
        tag="large",
    )
    sizes()
    large = time_claims(
        "large", iterations=args.iterations, worker_id=worker_id, claim_kinds=claim_kinds
    )

    say()
    for q in ("p50", "p95", "p99"):
        ratio = large[q] / small[q]
        goal = (
            f" (goal <= {GOAL_RATIO:g}x: {'met' if ratio <= GOAL_RATIO else 'NOT met'})"
            if q != "p99"
            else ""
        )
        say(f"  large/small {q}: {large[q]:.2f} / {small[q]:.2f} ms = {ratio:.2f}x{goal}")

    say()
    # First: a rollback (the two plans below) makes psycopg deallocate the connection's prepared statements.
    say(
        "  prepared statements on this connection after the timed claims (generic / custom plans so far):"
    )
    for generic, custom, text in prepared_statements()[:4]:
        say(f"    {generic:>5} / {custom:<5} {text[:90]}")
    say()
    say(
        "  the plan the worker's statement ran (auto_explain of one claim in the large state, rolled back):"
    )
    for line in generic_claim_plan(worker_id, claim_kinds):
        say("    " + line)
    say()
    say(
        "  the claim's nodes that read or write a table, small state vs large state (auto_explain of one claim each,"
    )
    say(
        "  rolled back; shared buffers hit+read and ms: a scan's inclusive of its subplans, an Update's or Insert's own):"
    )
    compare_nodes(small_nodes, claim_nodes(worker_id, claim_kinds))
    say()
    say(
        "  EXPLAIN (ANALYZE, BUFFERS) of one claim in the large state (same statement and parameters, rolled back;"
    )
    say("  planned for these parameter values):")
    for line in explain_claim(worker_id, claim_kinds):
        say("    " + line)

    say()
    say(
        f"2. heartbeat cost versus runs held (large state; heartbeat lease {LEASE} s; {args.beats} beats per size,"
        f" fewer (at least 10) past {args.beat_seconds:g} s)"
    )
    heartbeats(args, tenant, claim_kinds)
    say(
        "  CPU ms/hb: the backend's utime+stime per heartbeat (/proc/<pid>/stat), schedstat: its on-CPU time;"
    )
    say(
        "  WAL B/hb: pg_current_wal_lsn() difference / beats (the whole server's WAL, other databases' too);"
    )
    say(
        "  stmt WAL B: the heartbeat statement's own WAL (auto_explain, ModifyTable nodes; no commit record)."
    )
    say("  per run: p50, CPU (schedstat when available) and statement WAL divided by runs held.")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--finished",
        type=int,
        default=None,
        help="finished (done) runs in the large state (default 1000000; --quick 100000)",
    )
    parser.add_argument(
        "--queued",
        type=int,
        default=None,
        help="queued runs in the large state (default 100000; --quick 10000)",
    )
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="timed claims per state (default 300; --quick 50)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="small counts: 100000 + 10000, 50 iterations"
    )
    parser.add_argument(
        "--held",
        default="1,10,100,1000,5000",
        help="runs held per heartbeat size (default %(default)s)",
    )
    parser.add_argument(
        "--beats", type=int, default=50, help="timed heartbeats per size (default 50)"
    )
    parser.add_argument(
        "--beat-seconds",
        type=float,
        default=120,
        help="stop a size's heartbeats after this long, once 10 are done (default 120)",
    )
    args = parser.parse_args(argv)
    quick = args.quick
    if args.finished is None:
        args.finished = 100_000 if quick else 1_000_000
    if args.queued is None:
        args.queued = 10_000 if quick else 100_000
    if args.iterations is None:
        args.iterations = 50 if quick else 300
    try:
        args.held = sorted({int(x) for x in args.held.split(",") if x.strip()})
    except ValueError:
        parser.error("--held takes comma-separated numbers, like 1,10,100")
    if args.finished < SMALL_FINISHED or args.queued < SMALL_QUEUED:
        parser.error(
            f"the large state needs at least {SMALL_FINISHED} finished and {SMALL_QUEUED} queued runs"
        )
    if args.iterations < 10 or args.beats < 1 or not args.held or args.held[0] < 1:
        parser.error("--iterations must be at least 10, --beats at least 1, --held positive")
    if args.held[-1] > args.queued:
        parser.error(
            f"--held {args.held[-1]} needs at least as many queued runs (--queued {args.queued})"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through the finally block, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    wall = time.perf_counter()
    db = Database(agent_modules="bench.agents")
    try:
        db.setup()
        say("=" * 78)
        say(
            "agentruns claim scale benchmark: claim latency at scale, heartbeat cost versus runs held"
        )
        say("=" * 78)
        say(f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL (.data/pg)'}")
        say(f"PostgreSQL : {db.version}")
        say("settings   : " + ", ".join(f"{k}={v}" for k, v in sorted(db.settings.items())))
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        one, five, fifteen = os.getloadavg()
        say(
            f"machine    : {os.cpu_count()} CPUs, Python {sys.version.split()[0]},"
            f" load average {one:.2f} {five:.2f} {fifteen:.2f} (before)"
        )
        say(
            f"options    : --finished {args.finished} --queued {args.queued} --iterations {args.iterations}"
            f" --held {','.join(map(str, args.held))} --beats {args.beats} --beat-seconds {args.beat_seconds:g}"
            f"{' (--quick)' if args.quick else ''}"
        )
        run(args)
        say()
        one, five, fifteen = os.getloadavg()
        say(
            f"load average {one:.2f} {five:.2f} {fifteen:.2f} (after) on {os.cpu_count()} CPUs;"
            f" wall time {time.perf_counter() - wall:.0f} s"
        )
        return 0
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
