"""Event streams benchmark: N live SSE streams on ONE ``manage.py serve`` process.

    .venv/bin/python bench/streams.py                  # 500 streams, 200 Events/s for 20 s, 20 bursts of 50
    .venv/bin/python bench/streams.py --quick          # 50 streams, 5 s, 5 bursts
    .venv/bin/python bench/streams.py --streams 1000 --rate 500 --seconds 30
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/streams.py

Like the other benchmarks it uses DATABASE_URL or the embedded PostgreSQL and
works in a database ``bench_<pid>`` of its own, dropped at the end. It
submits ``--streams`` queued runs of ``bench_noop`` (bench/agents.py; no
worker listens on its queue, so nothing but the bench writes their Events),
starts one ``manage.py serve 127.0.0.1:<free port> --workers 1`` and opens
one ``GET /api/runs/{id}/events`` per run (``Authorization: Bearer`` with a
read-only key) from one asyncio loop on raw sockets, and waits until every
stream has read its replayed Event (seq 1, the submit). Then:

* steady: ``--rate`` Events per second for ``--seconds``, spread over all
  runs (each pass over the runs in a new random order), each Event its own
  transaction (``append_event`` in ``transaction.atomic``), like workers'
  checkpoints;
* bursts: ``--rounds`` rounds of ``--burst`` Events on as many random runs
  in ONE transaction (a claim's or a batch's many runs committing at once),
  each round waiting until all were read.

The commits happen on one thread of the bench process; its clock is read
(``time.time()``) right after COMMIT returns, and the client's when a chunk
holding the Event's ``id:`` line was read off the socket, on the same
machine. Every stream must read exactly the seqs 1..last of its run, each
once, in order, with ``data`` naming the same run and seq; a stream that
ends or errors before the bench closes it is a failure.

Measured on the serve process: RSS (VmRSS) idle, after one warm-up stream,
with all N open and after they close; its database connections (backends of
the bench database with application_name ``agentruns serve``, see
config/settings.py), told apart by their last statement (LISTEN, the hub's
reads and watches, Django's request connections), at each point and sampled
every 0.25 s; its CPU seconds and its backends' in each phase. The client
(the asyncio loop, the committer and sampler threads) runs on the same cores
as the server and PostgreSQL: every figure includes that contention.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, cpu_times, pct, say  # noqa: E402
from bench.inflight import cpu_seconds, proc_status  # noqa: E402

KIND = "bench_noop"  # queue bench_accept: nobody executes it
EVENT_TYPE = "bench.ping"  # not terminal: the streams stay open
SERVE_APP = "agentruns serve"  # config/settings.py: "agentruns <command>"
BENCH_APP = "bench streams"  # the bench's own connections, left out of every count
HOST = "127.0.0.1"


# ---------------------------------------------------------------- the client


class Stream:
    """One SSE client on a raw socket: the seqs it read, in order, and when."""

    __slots__ = (
        "index",
        "run_id",
        "replay_to",
        "seqs",
        "arrivals",
        "bad_data",
        "keepalives",
        "others",
        "error",
        "ended",
        "t_start",
        "t_ready",
        "writer",
        "_gate",
    )

    def __init__(self, index: int, run_id, replay_to: int) -> None:
        self.index = index
        self.run_id = run_id
        self.replay_to = replay_to
        self.seqs: list[int] = []
        self.arrivals: dict[int, float] = {}
        self.bad_data = 0  # data whose run_id or seq is not the stream's run or the id: line's
        self.keepalives = 0
        self.others = 0  # blocks with neither id: nor a comment (ephemeral updates)
        self.error: str | None = None
        self.ended: float | None = None  # the server ended the stream
        self.t_start = self.t_ready = 0.0
        self.writer: asyncio.StreamWriter | None = None
        self._gate: asyncio.Semaphore | None = None

    async def run(self, port: int, key: str, gate: asyncio.Semaphore, ready: Ready) -> None:
        await gate.acquire()
        self._gate = gate
        self.t_start = time.time()
        try:
            reader, self.writer = await asyncio.open_connection(HOST, port)
            self.writer.write(
                f"GET /api/runs/{self.run_id}/events HTTP/1.1\r\nHost: {HOST}:{port}\r\n"
                f"Authorization: Bearer {key}\r\nAccept: text/event-stream\r\n\r\n".encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                body = await asyncio.wait_for(reader.read(300), 2)
                raise ValueError(f"HTTP {status}: {body[:200]!r}")
            chunked = b"transfer-encoding: chunked" in head.lower()
            buf = b""
            while True:
                if chunked:
                    size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                    if size == 0:
                        break
                    data = (await reader.readexactly(size + 2))[:-2]
                else:
                    data = await reader.read(65536)
                    if not data:
                        break
                now = time.time()
                buf += data
                while (end := buf.find(b"\n\n")) >= 0:
                    self._block(buf[:end], now)
                    buf = buf[end + 2 :]
                if self.t_ready == 0.0 and self.seqs and self.seqs[-1] >= self.replay_to:
                    self.t_ready = now
                    self._release()
                    ready.one()
            self.ended = time.time()
        except asyncio.CancelledError:
            raise
        except (
            OSError,
            ValueError,
            IndexError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            TimeoutError,
        ) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self._release()
            if self.t_ready == 0.0:
                ready.one()  # counted, so that the opening never waits for a stream that failed

    def _release(self) -> None:
        if self._gate is not None:
            self._gate.release()
            self._gate = None

    def _block(self, block: bytes, now: float) -> None:
        seq = data = None
        comment = False
        for line in block.split(b"\n"):
            if line.startswith(b"id: "):
                seq = int(line[4:])
            elif line.startswith(b"data: "):
                data = line[6:]
            elif line.startswith(b":"):
                comment = True
        if seq is None:
            if data is not None:
                self.others += 1
            elif comment and b"keepalive" in block:
                self.keepalives += 1
            return
        self.seqs.append(seq)
        self.arrivals.setdefault(seq, now)
        try:
            parsed = json.loads(data or b"")
            if parsed["seq"] != seq or parsed["run_id"] != str(self.run_id):
                self.bad_data += 1
        except (ValueError, KeyError, TypeError):
            self.bad_data += 1

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Ready:
    """Counts streams that read their replay (or failed); ``wait()`` returns when all have."""

    def __init__(self, total: int) -> None:
        self.left = total
        self.done = asyncio.Event()
        if total == 0:
            self.done.set()

    def one(self) -> None:
        self.left -= 1
        if self.left <= 0:
            self.done.set()


async def open_streams(
    streams: list[Stream], port: int, key: str, concurrency: int, timeout: float
) -> tuple[list[asyncio.Task], float]:
    gate = asyncio.Semaphore(concurrency)
    ready = Ready(len(streams))
    t0 = time.time()
    tasks = [asyncio.create_task(s.run(port, key, gate, ready)) for s in streams]
    try:
        await asyncio.wait_for(ready.done.wait(), timeout)
    except TimeoutError:
        pass
    return tasks, time.time() - t0


async def close_streams(streams: list[Stream], tasks: list[asyncio.Task]) -> None:
    for stream in streams:
        stream.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def http_status(port: int, path: str) -> int | None:
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(HOST, port), 2)
    except (OSError, TimeoutError):
        return None
    try:
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        return int(head.split(b" ", 2)[1])
    except (OSError, TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError):
        return None
    finally:
        writer.close()


# ------------------------------------------------------------- the committer


@dataclass(frozen=True)
class Committed:
    stream: int  # index of the run's stream
    seq: int
    sent: float  # time.time() just before COMMIT was sent
    at: float  # time.time() right after COMMIT returned
    phase: str
    late: float = 0.0  # how far behind its schedule the commit began (steady phase)


def steady_schedule(n_runs: int, rate: float, seconds: float) -> list[int]:
    """The run of each steady Event: passes over all runs, each pass in a new random order."""
    order: list[int] = []
    while len(order) < int(rate * seconds):
        order += random.sample(range(n_runs), n_runs)
    return order[: int(rate * seconds)]


def commit_steady(
    run_ids: list, schedule: list[int], rate: float, t0: float, part: int, parts: int
) -> list[Committed]:
    """Every ``parts``-th Event of the schedule from ``part``, each at ``t0 + i / rate``, one transaction each."""
    from django.db import transaction

    from runs.events import SYSTEM, append_event

    out: list[Committed] = []
    for i in range(part, len(schedule), parts):
        due = t0 + i / rate
        delay = due - time.time()
        if delay > 0:
            time.sleep(delay)
        began = time.time()
        index = schedule[i]
        with transaction.atomic():
            seq = append_event(
                run_id=run_ids[index], type=EVENT_TYPE, actor=SYSTEM, payload={"i": i}
            )
            sent = time.time()
        out.append(Committed(index, seq, sent, time.time(), "steady", max(0.0, began - due)))
    return out


def commit_burst(run_ids: list, k: int, round_no: int) -> list[Committed]:
    """One Event on each of ``k`` random runs, all in one transaction."""
    from django.db import transaction

    from runs.events import SYSTEM, append_event

    chosen = random.sample(range(len(run_ids)), k)
    with transaction.atomic():
        seqs = [
            append_event(
                run_id=run_ids[i], type=EVENT_TYPE, actor=SYSTEM, payload={"round": round_no}
            )
            for i in chosen
        ]
        sent = time.time()
    at = time.time()
    return [Committed(i, seq, sent, at, "burst") for i, seq in zip(chosen, seqs, strict=True)]


def close_thread_connection(barrier: threading.Barrier) -> None:
    """Close this committer thread's connection; the barrier holds each thread until all have."""
    from django.db import connection

    connection.close()
    barrier.wait(10)


async def delivered(streams: list[Stream], committed: list[Committed], timeout: float) -> bool:
    """Wait until every committed Event was read by its stream (or ``timeout``)."""
    pending = {(c.stream, c.seq) for c in committed}
    deadline = time.monotonic() + timeout
    while True:
        pending = {(i, seq) for i, seq in pending if seq not in streams[i].arrivals}
        if not pending:
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)


# ----------------------------------------------------- the serve process's side


class Sampler:
    """The serve process's connections (by role), RSS and its backends' CPU, every ``interval`` seconds."""

    ROLES = ("listen", "hub", "django", "unused")
    _QUERY = """
        SELECT pid, coalesce(state, '?'), application_name,
               CASE WHEN query ILIKE 'LISTEN%%' THEN 'listen'
                    WHEN query LIKE '%%runs_streamwatch%%' OR query LIKE '%%unnest(%%' THEN 'hub'
                    WHEN query = '' THEN 'unused'
                    ELSE 'django' END
        FROM pg_stat_activity
        WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
    """

    def __init__(self, url: str, pid: int, interval: float = 0.25) -> None:
        import psycopg

        self.pid = pid
        self.interval = interval
        self.conn = psycopg.connect(url, autocommit=True, application_name=f"{BENCH_APP} sampler")
        self.lock = threading.Lock()
        self.samples: list[dict] = []
        self.backend_cpu: dict[
            int, float
        ] = {}  # the serve process's backends: their last CPU reading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.conn.close()

    def sample(self) -> dict:
        with self.lock:
            rows = self.conn.execute(self._QUERY).fetchall()
            watches = self.conn.execute("SELECT count(*) FROM runs_streamwatch").fetchone()[0]
        serve = [(pid, state, role) for pid, state, app, role in rows if app == SERVE_APP]
        others = [
            app for _, _, app, _ in rows if app != SERVE_APP and not app.startswith(BENCH_APP)
        ]
        for backend, _, _ in serve:
            used = _postgres_cpu(backend)
            if used is not None:
                self.backend_cpu[backend] = used
        status = proc_status(self.pid)
        sample = {
            "t": time.time(),
            "serve": len(serve),
            "roles": dict(Counter(role for _, _, role in serve)),
            "states": dict(Counter(state for _, state, _ in serve)),
            "others": len(others),
            "other_apps": dict(Counter(others)),
            "watches": watches,
            "rss_mb": status[0] if status else None,
            "threads": status[1] if status else None,
        }
        self.samples.append(sample)
        return sample

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except (
                Exception
            ) as exc:  # the bench reports what it has; a sampler failure is not the server's
                say(f"(sampler: {exc})")
                return

    def peak(self, since: float) -> dict:
        window = [s for s in self.samples if s["t"] >= since]
        return max(window, key=lambda s: s["serve"]) if window else {}


def _postgres_cpu(pid: int) -> float | None:
    """CPU seconds of a PostgreSQL backend, if it runs on this machine (a remote pid is someone else)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            if b"postgres" not in fh.read():
                return None
    except OSError:
        return None
    return cpu_seconds(pid)


class Meter:
    """CPU used between start() and stop(): the serve process, its backends, the client, the machine."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def start(self) -> Meter:
        self.sampler.sample()
        self.t0 = time.time()
        self.serve0 = cpu_seconds(self.sampler.pid) or 0.0
        self.backends0 = dict(self.sampler.backend_cpu)
        self.client0 = _self_cpu()
        self.machine0 = cpu_times()
        return self

    def stop(self) -> dict:
        self.sampler.sample()
        busy, total = cpu_times()
        backends = sum(
            used - self.backends0.get(pid, 0.0) for pid, used in self.sampler.backend_cpu.items()
        )
        share = (busy - self.machine0[0]) / max(total - self.machine0[1], 1e-9)
        return {
            "wall": time.time() - self.t0,
            "serve": (cpu_seconds(self.sampler.pid) or 0.0) - self.serve0,
            "backends": backends,
            "client": _self_cpu() - self.client0,
            "machine": share,
        }


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    # The server goes when the bench goes, even if the bench is killed outright.
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def start_serve(port: int, log_path: Path) -> subprocess.Popen:
    env = os.environ.copy()
    env.pop("RUNS_APPLICATION_NAME", None)  # the serve process keeps its default name, SERVE_APP
    env.pop("DEBUG", None)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    argv = [sys.executable, str(ROOT / "manage.py"), "serve", f"{HOST}:{port}", "--workers", "1"]
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )


def stop_serve(proc: subprocess.Popen) -> str:
    """SIGTERM, then SIGKILL after 20 s; says how it ended."""
    if proc.poll() is not None:
        return f"had already exited with code {proc.returncode}"
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        return "did not stop within 20 s of SIGTERM: KILLED"
    # uvicorn re-raises the signal it caught once its graceful shutdown is done.
    how = (
        "by SIGTERM, re-raised by uvicorn"
        if proc.returncode == -signal.SIGTERM
        else f"with code {proc.returncode}"
    )
    return f"stopped {how} {time.time() - t0:.1f} s after SIGTERM"


# ---------------------------------------------------------------- the bench


def fmt_conns(sample: dict) -> str:
    if not sample:
        return "(no sample)"
    roles = ", ".join(
        f"{role} {sample['roles'][role]}" for role in Sampler.ROLES if sample["roles"].get(role)
    )
    text = f"{sample['serve']} ({roles or 'none'}; {dict(sorted(sample['states'].items()))})"
    if sample["others"]:
        text += f"; other backends {sample['other_apps']}"
    return text


def fmt_cpu(cpu: dict, events: int | None = None) -> str:
    text = (
        f"serve {cpu['serve']:.2f} s, its PostgreSQL backends {cpu['backends']:.2f} s, the bench client "
        f"{cpu['client']:.2f} s over {cpu['wall']:.1f} s; machine {cpu['machine'] * 100:.0f}% busy "
        f"({os.cpu_count()} CPUs)"
    )
    if events:
        text += (
            f" -> serve {cpu['serve'] / events * 1000:.2f} ms, backends "
            f"{cpu['backends'] / events * 1000:.2f} ms per Event"
        )
    return text


def fmt_latency(values: list[float]) -> str:
    if not values:
        return "(none read)"
    ms = [v * 1000 for v in values]
    return (
        f"p50 {pct(ms, 50):.1f} ms, p90 {pct(ms, 90):.1f}, p99 {pct(ms, 99):.1f}, max {max(ms):.1f}, "
        f"min {min(ms):.1f} (n={len(ms)})"
    )


def report_latency(streams: list[Stream], committed: list[Committed], all_read: bool, args) -> None:
    read = [c for c in committed if c.seq in streams[c.stream].arrivals]
    after = [streams[c.stream].arrivals[c.seq] - c.at for c in read]
    before = [streams[c.stream].arrivals[c.seq] - c.sent for c in read]
    negative = sum(1 for v in after if v < 0)
    say(
        f"             read {len(read)} of {len(committed)}"
        f"{'' if all_read else f' -- NOT ALL READ within {args.deliver_timeout:g} s'}"
    )
    say(f"             COMMIT returned -> read: {fmt_latency(after)}")
    say(
        f"             COMMIT sent     -> read: {fmt_latency(before)}  (the commit lies between the two)"
    )
    say(
        f"             COMMIT round trip: {fmt_latency([c.at - c.sent for c in committed])}; read before COMMIT "
        f"returned to the committer thread (it was not scheduled in time): {negative}; over the "
        f"{args.backstop:g} s backstop (a missed wake-up): {sum(1 for v in after if v > args.backstop)}"
    )


async def measure(
    args,
    run_ids: list,
    replay_to: list[int],
    warmup: tuple,
    key: str,
    port: int,
    serve: subprocess.Popen,
    sampler: Sampler,
) -> bool:
    loop = asyncio.get_running_loop()
    committers = ThreadPoolExecutor(args.committers, thread_name_prefix="committer")
    n = len(run_ids)
    streams = [Stream(i, run_id, replay_to[i]) for i, run_id in enumerate(run_ids)]
    tasks: list[asyncio.Task] = []
    committed: list[Committed] = []
    ok = True
    try:
        # Idle, then one warm-up stream on a run of its own (the hub starts on the first stream).
        idle = sampler.sample()
        say(
            f"idle       : serve RSS {idle['rss_mb']:.1f} MB, {idle['threads']} threads; "
            f"connections {fmt_conns(idle)}"
        )
        warm = Stream(-1, warmup[0], warmup[1])
        warm_tasks, warm_open = await open_streams([warm], port, key, 1, 30)
        one = sampler.sample()
        say(
            f"1 stream   : opened and read its replay in {warm_open * 1000:.0f} ms; serve RSS {one['rss_mb']:.1f} MB; "
            f"connections {fmt_conns(one)}{'; ERROR ' + warm.error if warm.error else ''}"
        )
        await close_streams([warm], warm_tasks)
        await asyncio.sleep(1)
        base = sampler.sample()
        say(
            f"baseline   : after the warm-up stream closed: serve RSS {base['rss_mb']:.1f} MB, "
            f"{base['threads']} threads; "
            f"connections {fmt_conns(base)}; watches {base['watches']}"
        )

        # Open N streams.
        meter = Meter(sampler).start()
        tasks, opening = await open_streams(
            streams, port, key, args.open_concurrency, args.open_timeout
        )
        cpu_open = meter.stop()
        await asyncio.sleep(1)
        full = sampler.sample()
        opened = [s for s in streams if s.t_ready]
        failed = [s for s in streams if not s.t_ready]
        waits = [s.t_ready - s.t_start for s in opened]
        say()
        say(
            f"open       : {len(opened)}/{n} streams open and replayed in {opening:.2f} s "
            f"(at most {args.open_concurrency} opening at once); open -> replay read: "
            f"{fmt_latency(waits)}"
        )
        if failed:
            ok = False
            reasons = Counter((s.error or "no replay in time")[:160] for s in failed)
            say(f"             FAILED {len(failed)}: {dict(reasons.most_common(5))}")
        say(f"             CPU {fmt_cpu(cpu_open)}")
        rss_per = (full["rss_mb"] - base["rss_mb"]) * 1024 / max(n, 1)
        say(
            f"with {n:<6}: serve RSS {full['rss_mb']:.1f} MB (+{full['rss_mb'] - base['rss_mb']:.1f} MB over the "
            f"baseline, {rss_per:.1f} KB per stream), {full['threads']} threads "
            f"(+{full['threads'] - base['threads']} over the baseline)"
        )
        say(f"             connections {fmt_conns(full)}; watches {full['watches']}")
        peak_open = sampler.peak(meter.t0)
        say(f"             peak connections while opening {fmt_conns(peak_open)}")

        # Steady rate.
        if args.seconds > 0 and args.rate > 0 and opened:
            say()
            say(
                f"steady     : {args.rate:g} Events/s for {args.seconds:g} s over {n} runs, one transaction each, "
                f"from {args.committers} committer thread(s) ..."
            )
            schedule = steady_schedule(n, args.rate, args.seconds)
            meter = Meter(sampler).start()
            t0 = time.time() + 0.05
            parts = await asyncio.gather(
                *(
                    loop.run_in_executor(
                        committers,
                        commit_steady,
                        run_ids,
                        schedule,
                        args.rate,
                        t0,
                        j,
                        args.committers,
                    )
                    for j in range(args.committers)
                )
            )
            steady = sorted((c for part in parts for c in part), key=lambda c: c.at)
            spent = steady[-1].at - t0 if steady else 0.0
            all_read = await delivered(streams, steady, args.deliver_timeout)
            cpu = meter.stop()
            committed += steady
            say(
                f"             committed {len(steady)} in {spent:.2f} s ({len(steady) / max(spent, 1e-9):.0f}/s); "
                f"commits began behind schedule by p50 {pct([c.late for c in steady], 50) * 1000:.1f} ms, "
                f"max {max(c.late for c in steady) * 1000:.0f} ms"
            )
            report_latency(streams, steady, all_read, args)
            say(f"             CPU {fmt_cpu(cpu, len(steady))}")
            say(
                f"             peak connections {fmt_conns(sampler.peak(meter.t0))}; RSS "
                f"{sampler.samples[-1]['rss_mb']:.1f} MB"
            )

        # Bursts.
        if args.rounds > 0 and opened:
            k = min(args.burst, n)
            say()
            say(
                f"bursts     : {args.rounds} rounds of {k} Events on {k} random runs in one transaction, "
                f"{args.gap:g} s apart ..."
            )
            meter = Meter(sampler).start()
            burst: list[Committed] = []
            all_read = True
            for round_no in range(args.rounds):
                batch = await loop.run_in_executor(committers, commit_burst, run_ids, k, round_no)
                burst += batch
                all_read = await delivered(streams, batch, args.deliver_timeout) and all_read
                await asyncio.sleep(args.gap)
            cpu = meter.stop()
            committed += burst
            say(f"             committed {len(burst)}")
            report_latency(streams, burst, all_read, args)
            firsts, lasts = [], []
            for r in range(args.rounds):
                got = [
                    streams[c.stream].arrivals[c.seq] - c.at
                    for c in burst[r * k : (r + 1) * k]
                    if c.seq in streams[c.stream].arrivals
                ]
                if got:
                    firsts.append(min(got))
                    lasts.append(max(got))
            say(f"             per round, its first Event read: {fmt_latency(firsts)}")
            say(f"             per round, its last Event read : {fmt_latency(lasts)}")
            say(f"             CPU {fmt_cpu(cpu, len(burst))}")

        # Verify every stream, before closing them.
        await asyncio.sleep(0.5)
        ok = verify(streams, committed, replay_to) and ok
        if serve.poll() is not None:
            say(f"serve      : EXITED with code {serve.returncode} during the bench")
            ok = False

        # Close them all: the watches and the hub's connections should go.
        t_close = time.time()
        await close_streams(streams, tasks)
        tasks = []
        after = {}
        for _ in range(50):
            await asyncio.sleep(0.2)
            after = sampler.sample()
            if after["watches"] == 0:
                break
        say(
            f"closed     : all streams closed; {time.time() - t_close:.1f} s later watches {after['watches']}, "
            f"serve RSS {after['rss_mb']:.1f} MB, {after['threads']} threads, connections {fmt_conns(after)}"
        )
        if after["watches"]:
            say(
                "             WATCHES LEFT after every stream closed: their runs keep sending NOTIFY"
            )
        return ok
    finally:
        await close_streams(streams, tasks)
        barrier = threading.Barrier(args.committers)
        await asyncio.gather(
            *(
                loop.run_in_executor(committers, close_thread_connection, barrier)
                for _ in range(args.committers)
            ),
            return_exceptions=True,
        )
        committers.shutdown(wait=True)


def verify(streams: list[Stream], committed: list[Committed], replay_to: list[int]) -> bool:
    """Each stream read 1..last of its run exactly once, in order; every commit read once."""
    expected: dict[int, list[int]] = {
        i: list(range(1, replay_to[i] + 1)) for i in range(len(streams))
    }
    for c in sorted(committed, key=lambda c: (c.stream, c.seq)):
        expected[c.stream].append(c.seq)
    bad_runs = 0
    duplicates = missing = out_of_order = extra = 0
    examples: list[str] = []
    for stream in streams:
        want = expected[stream.index]
        got = stream.seqs
        counts = Counter(got)
        dup = sum(v - 1 for v in counts.values() if v > 1)
        miss = len(set(want) - set(got))
        unexpected = len(set(got) - set(want))
        disorder = sum(1 for a, b in zip(got, got[1:], strict=False) if b <= a)
        duplicates += dup
        missing += miss
        extra += unexpected
        out_of_order += disorder
        if got != want:
            bad_runs += 1
            if len(examples) < 5:
                examples.append(
                    f"run {stream.run_id}: expected {want[:12]}{'...' if len(want) > 12 else ''}, "
                    f"read {got[:12]}{'...' if len(got) > 12 else ''}"
                )
    bad_data = sum(s.bad_data for s in streams)
    ended = sum(1 for s in streams if s.ended)
    errors = Counter(s.error[:160] for s in streams if s.error)
    read_once = sum(1 for c in committed if streams[c.stream].seqs.count(c.seq) == 1)
    ok = not (bad_runs or bad_data or ended or errors) and read_once == len(committed)
    say()
    say(
        f"verify     : committed {len(committed)} Events, read exactly once by their stream {read_once}; "
        f"streams with exactly 1..last in order {len(streams) - bad_runs}/{len(streams)}; duplicates {duplicates}, "
        f"missing {missing}, unexpected {extra}, out of order {out_of_order}, bad data {bad_data}; "
        f"ended by the server {ended}; errors {dict(errors) or 0}; keepalives "
        f"{sum(s.keepalives for s in streams)}, other blocks {sum(s.others for s in streams)} -> "
        f"{'OK' if ok else 'FAILED'}"
    )
    for line in examples:
        say(f"             {line}")
    return ok


def setup_runs(n: int) -> tuple[list, list[int], tuple, str]:
    """A tenant, a read-only key, n + 1 queued runs (the last one for the warm-up stream)."""
    from django.db import transaction

    from runs.keys import create_api_key
    from runs.models import ApiKey, Run
    from runs.services import submit_run
    from runs.tenants import ensure_tenant

    tenant, _ = ensure_tenant(slug="bench-streams", max_running=10, max_queued=10_000_000)
    key = create_api_key(
        tenant=tenant, name="bench streams", scopes=[ApiKey.Scope.READ.value]
    ).secret
    started = time.perf_counter()
    with transaction.atomic():
        runs = [submit_run(tenant=tenant, kind=KIND, input={"i": i}) for i in range(n + 1)]
    seqs = dict(Run.objects.filter(id__in=[r.pk for r in runs]).values_list("id", "last_event_seq"))
    say(
        f"runs       : {n + 1} queued runs of {KIND} via submit_run in {time.perf_counter() - started:.2f} s "
        f"(one for the warm-up stream); replay per stream: seq 1..{max(seqs.values())}"
    )
    ids = [r.pk for r in runs]
    return ids[:n], [seqs[i] for i in ids[:n]], (ids[n], seqs[ids[n]]), key


def run(args, db: Database) -> bool:
    from django.conf import settings

    args.backstop = settings.RUNS_STREAM_BACKSTOP_SECONDS
    say(
        f"stream cfg : RUNS_STREAM_DB_CONNECTIONS={settings.RUNS_STREAM_DB_CONNECTIONS}, "
        f"RUNS_STREAM_BACKSTOP_SECONDS={settings.RUNS_STREAM_BACKSTOP_SECONDS:g}, "
        f"RUNS_STREAM_KEEPALIVE_SECONDS={settings.RUNS_STREAM_KEEPALIVE_SECONDS:g}, RUNS_LISTEN={settings.RUNS_LISTEN}, "
        f"Django pool {settings.DATABASES['default']['OPTIONS'].get('pool', 'off')}"
    )
    run_ids, replay_to, warmup, key = setup_runs(args.streams)

    logdir = Path(tempfile.mkdtemp(prefix="bench-streams-"))
    log_path = logdir / "serve.log"
    port = free_port()
    serve = start_serve(port, log_path)
    say(
        f"server     : manage.py serve {HOST}:{port} --workers 1 (uvicorn, pid {serve.pid}, log {log_path})"
    )
    sampler = None
    stopped = "not stopped"
    try:

        async def wait_up() -> float:
            t0 = time.time()
            while time.time() - t0 < 60:
                if serve.poll() is not None:
                    raise RuntimeError(f"serve exited with code {serve.returncode}")
                if await http_status(port, "/api/health") == 200:
                    return time.time() - t0
                await asyncio.sleep(0.2)
            raise RuntimeError("serve did not answer /api/health within 60 s")

        try:
            up = asyncio.run(wait_up())
        except RuntimeError as exc:
            say(f"server     : {exc}")
            say(log_path.read_text(errors="replace")[-3000:])
            return False
        say(f"             answered /api/health after {up:.1f} s")
        sampler = Sampler(os.environ["DATABASE_URL"], serve.pid)
        sampler.start()
        say()
        ok = asyncio.run(measure(args, run_ids, replay_to, warmup, key, port, serve, sampler))
    finally:
        if sampler is not None:
            sampler.stop()
        stopped = stop_serve(serve)
    log_text = log_path.read_text(errors="replace")
    problems = {
        label: log_text.count(needle)
        for label, needle in (
            ("tracebacks", "Traceback"),
            ("errors", " ERROR "),
            ("warnings", " WARNING "),
            ("hub task failed", "a hub task failed"),
            ("LISTEN lost", "LISTEN connection lost"),
            ("pool timeouts", "PoolTimeout"),
        )
    }
    say(f"serve log  : {stopped}; " + ", ".join(f"{k} x{v}" for k, v in problems.items()))
    if problems["tracebacks"] or problems["errors"] or problems["hub task failed"]:
        say("  --- serve log tail ---")
        say("\n".join(log_text.splitlines()[-30:]))
        ok = False
    return ok


def code_version() -> str:
    """The commit measured, and files of the server that differ from it in the working tree."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "config", "runs"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "(not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"commit {head or '?'}" + (
        f", uncommitted changes in {', '.join(changed)}" if changed else ", clean"
    )


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--streams", type=int, default=None, help="concurrent streams, one run each (default 500)"
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=200,
        help="Events per second in the steady phase (default 200)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="length of the steady phase (default 20; 0 skips it)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="burst rounds (default 20; 0 skips them)"
    )
    parser.add_argument(
        "--burst", type=int, default=50, help="Events per burst, one transaction (default 50)"
    )
    parser.add_argument(
        "--committers",
        type=int,
        default=4,
        help="threads committing the steady Events, each its share of the rate (default 4)",
    )
    parser.add_argument(
        "--gap", type=float, default=0.2, help="seconds between burst rounds (default 0.2)"
    )
    parser.add_argument(
        "--open-concurrency", type=int, default=50, help="streams being opened at once (default 50)"
    )
    parser.add_argument(
        "--open-timeout", type=float, default=120, help="give up opening after this (default 120 s)"
    )
    parser.add_argument(
        "--deliver-timeout",
        type=float,
        default=15,
        help="wait this long for every committed Event to be read (default 15 s)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="50 streams, 5 s steady, 5 burst rounds"
    )
    args = parser.parse_args(argv)
    args.streams = args.streams if args.streams is not None else (50 if args.quick else 500)
    args.seconds = args.seconds if args.seconds is not None else (5 if args.quick else 20)
    args.rounds = args.rounds if args.rounds is not None else (5 if args.quick else 20)
    if args.committers < 1:
        parser.error("--committers must be at least 1")
    if args.streams < 1 or args.rate < 0 or args.seconds < 0 or args.rounds < 0 or args.burst < 1:
        parser.error(
            "--streams and --burst must be at least 1; --rate, --seconds and --rounds at least 0"
        )
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    # SIGTERM ends the bench through the finally blocks, like Ctrl-C.
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:  # N client sockets here, N more in the server (which inherits the limit)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.environ["RUNS_APPLICATION_NAME"] = BENCH_APP
    # The server speaks plain HTTP on loopback, as behind a proxy that terminates TLS.
    os.environ["SECURE_SSL_REDIRECT"] = "0"
    db = Database(agent_modules="bench.agents")
    try:
        db.setup()
        say("=" * 78)
        say("agentruns event streams benchmark")
        say("=" * 78)
        say(f"command    : {shlex.join([Path(sys.executable).name, *sys.argv])}")
        say(f"server     : {'DATABASE_URL' if db.from_env else 'embedded PostgreSQL (.data/pg)'}")
        say(f"PostgreSQL : {db.version}")
        say("pg settings: " + ", ".join(f"{k}={v}" for k, v in sorted(db.settings.items())))
        say(f"database   : {db.name} (created for this run, dropped at the end)")
        say(f"code       : {code_version()}")
        one, five, _ = os.getloadavg()
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        say(
            f"machine    : {os.cpu_count()} CPUs ({cores} usable), Python {sys.version.split()[0]}, "
            f"load {one:.2f} {five:.2f}; open files limit {resource.getrlimit(resource.RLIMIT_NOFILE)[0]}"
        )
        say(
            f"settings   : {'quick' if args.quick else 'full'}: {args.streams} streams; steady {args.rate:g} Events/s "
            f"for {args.seconds:g} s from {args.committers} committer thread(s); {args.rounds} bursts of {min(args.burst, args.streams)}, {args.gap:g} s apart; "
            f"open {args.open_concurrency} at once; wait {args.deliver_timeout:g} s for delivery"
        )
        say(
            f"client     : ONE asyncio loop on raw sockets (HTTP/1.1, chunked SSE), {args.committers} committer "
            f"thread(s), one sampler thread, in this process, on the same {cores} cores as the serve process and PostgreSQL: every "
            f"figure includes that contention"
        )
        return 0 if run(args, db) else 1
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
