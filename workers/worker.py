"""The worker process: claim, execute in a bounded pool, heartbeat, shut down gracefully.

Threads: the main loop claims (woken by LISTEN/NOTIFY, with a poll as the
backstop), a pool of ``concurrency`` threads executes runs, a heartbeat
thread extends every held lease in one statement per interval, and a
listener thread owns the one dedicated LISTEN connection.
"""

from __future__ import annotations

import contextvars
import logging
import signal
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from django.conf import settings
from django.db import DatabaseError

from runs.db import notify_queues, refused, release_connection, with_retries
from runs.engine import claim as claims
from runs.engine.fleet import register_worker, worker_stopped
from runs.registry import all_kinds
from workers.committer import Committer
from workers.executor import RunExecutor
from workers.host import RunControl
from workers.listener import Listener

logger = logging.getLogger(__name__)

# How long a busy worker lets a free slot wait for others to free up before it claims.
CLAIM_COOLDOWN_SECONDS = 0.005


@dataclass
class WorkerOptions:
    queues: list[str] = field(default_factory=lambda: ["default"])
    concurrency: int = 5
    lease: float = 300.0
    heartbeat: float = 30.0
    poll: float = 1.0
    burst: bool = False
    listen: bool = True

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.lease <= 0 or self.heartbeat <= 0 or self.poll <= 0:
            raise ValueError("lease, heartbeat and poll must be positive")
        if self.heartbeat > self.lease / 3:
            raise ValueError(
                f"heartbeat ({self.heartbeat}s) must be at most a third of the lease ({self.lease}s)"
            )
        if not self.queues:
            raise ValueError("at least one queue is needed")

    @classmethod
    def from_settings(cls, **overrides) -> WorkerOptions:
        values: dict[str, Any] = {
            "concurrency": settings.RUNS_CONCURRENCY,
            "lease": settings.RUNS_LEASE_SECONDS,
            "heartbeat": settings.RUNS_HEARTBEAT_SECONDS,
            "poll": settings.RUNS_POLL_SECONDS,
            "listen": settings.RUNS_LISTEN,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class Held:
    run_id: uuid.UUID
    control: RunControl


class Worker:
    def __init__(self, options: WorkerOptions):
        self.options = options
        self.id = uuid.uuid4()
        self.lease = options.lease
        self.poll = options.poll
        self.kinds = {kind.name: kind.version for kind in all_kinds()}
        self.resumes = {
            kind.name: sorted(kind.resumes_versions)
            for kind in all_kinds()
            if kind.resumes_versions
        }
        self.stopping = threading.Event()
        self._wake = threading.Event()
        self._beat_now = threading.Event()
        self._check_runs = False  # the next heartbeat reads the runs held (_control)
        # Keyed by lease token, never reused: a run released and claimed
        # again by this worker before its old thread ended is two entries.
        self._held: dict[int, Held] = {}
        self._lock = threading.Lock()
        self._last_heartbeat_ok = time.monotonic()
        self._pool = ThreadPoolExecutor(max_workers=options.concurrency, thread_name_prefix="run")
        self._claim_batch = max(1, options.concurrency // 2)
        # Writes the runs' checkpoints and exits, those that come together in one transaction;
        # only while the loop runs (a worker never started writes each itself).
        self.committer = Committer(worker_id=self.id, lease=self.lease)
        self._listener: Listener | None = None
        self._heartbeat_thread: threading.Thread | None = None
        self._stuck: list[tuple[threading.Thread, float]] = []
        self._claim_errors = 0
        # Tenant slots of runs that left running, given back with the next
        # claim (one tenant-row write per claim, not one per run), as
        # (tenant, when the run left); only while the loop runs, so that
        # something always gives them back.
        self._returns: list[tuple[uuid.UUID, datetime]] = []
        self.defers_slot_returns = False
        # Set when a step thread never returned: the process should be replaced.
        self.poisoned = False

    # Lifecycle.
    def run(self, *, install_signal_handlers: bool = False) -> None:
        """Work until stopped (SIGTERM/SIGINT when installed, or stop()) or, with burst, until nothing is claimable."""
        # In a context of its own that says on every line which worker wrote it; the heartbeat, the
        # listener and each run start from a copy of it (a run's own fields: workers.tracing).
        contextvars.copy_context().run(self._run, install_signal_handlers)

    def _run(self, install_signal_handlers: bool) -> None:
        if not self.kinds:
            raise RuntimeError("no agent kinds are registered: nothing to run (see AGENT_MODULES)")
        structlog.contextvars.bind_contextvars(worker=str(self.id))
        self._register()
        if install_signal_handlers:
            self._install_signal_handlers()
        if self.options.listen and not self.options.burst:
            self._listener = Listener(
                queues=set(self.options.queues),
                on_notify=self._wake.set,
                on_control=self._control,
            )
            self._listener.start()
        self._heartbeat_thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self._heartbeat_loop,),
            name="heartbeat",
            daemon=True,
        )
        self._heartbeat_thread.start()
        logger.info(
            "worker %s started: queues=%s concurrency=%s kinds=%s",
            self.id,
            ",".join(self.options.queues),
            self.options.concurrency,
            ",".join(sorted(self.kinds)),
        )
        self.defers_slot_returns = True
        self.committer.start()
        try:
            self._loop()
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Stop claiming; in-flight steps finish, then their runs are released."""
        if not self.stopping.is_set():
            logger.info(
                "worker %s stopping: finishing in-flight steps, then releasing runs", self.id
            )
        self.stopping.set()
        self._wake.set()
        self._beat_now.set()

    def _loop(self) -> None:
        short_since = None  # when a busy worker first had a free slot it did not claim for yet
        while not self.stopping.is_set():
            self._check_stuck_steps()
            in_flight = self.in_flight()
            free = self.options.concurrency - in_flight
            claimed = 0
            if free > 0 and self.lease_is_fresh():
                # Busy, claim in batches: a slot that frees up waits up to
                # CLAIM_COOLDOWN_SECONDS for others, so that one claim takes
                # several runs rather than each run costing a claim of its
                # own. An idle worker claims at once (dispatch latency).
                if in_flight and free < self._claim_batch:
                    now = time.monotonic()
                    short_since = now if short_since is None else short_since
                    left = CLAIM_COOLDOWN_SECONDS - (now - short_since)
                    if left > 0:
                        self._wake.wait(left)
                        self._wake.clear()
                        continue
                short_since = None
                claimed = self._claim(free)
            if (
                self.options.burst
                and claimed == 0
                and self.in_flight() == 0
                and not self._claim_errors
            ):
                # Claim once more after the last run finished: a run it
                # released may be claimable again.
                if self._claim(self.options.concurrency) == 0:
                    break
                continue
            if claimed and claimed == free:
                continue  # there may be more: claim again as soon as a slot frees up
            self._wake.wait(min(self.poll, 1.0) if self._stuck else self.poll)
            self._wake.clear()

    def slot_returned(self, tenant_id: uuid.UUID, left_at: datetime) -> None:
        with self._lock:
            self._returns.append((tenant_id, left_at))

    def give_slots_back(self) -> None:
        """Give back now the tenant slots of runs that left running since the last claim; claims nothing."""
        if self._returns:
            self._claim(0)

    def _claim(self, n: int) -> int:
        tries = 0
        with self._lock:
            returned, self._returns = self._returns, []
        # Slots go back until a try may have given them back: one the server
        # refused (a deadlock) certainly did not, one whose connection was
        # lost may have. Left counted, they are a leak the reaper's
        # reconciliation ends, never a slot counted twice.
        unsent = True

        def claim_once() -> list[claims.ClaimedRun]:
            nonlocal tries, unsent
            tries += 1
            adopted: list[claims.ClaimedRun] = []
            if tries > 1 or self._claim_errors:
                # The failed try may have committed before its answer was
                # lost: its runs are ours in the database; adopt them.
                with self._lock:
                    held = [h.run_id for h in self._held.values()]
                adopted = claims.claimed_but_not_held(worker_id=self.id, held=held)
            try:
                return adopted + claims.claim(
                    worker_id=self.id,
                    queues=self.options.queues,
                    kinds=self.kinds,
                    n=n - len(adopted),
                    lease=self.lease,
                    resumes=self.resumes,
                    returned=returned if unsent else (),
                )
            except DatabaseError as exc:
                unsent = unsent and refused(exc)
                raise

        try:
            runs = with_retries(claim_once, attempts=3, what="claim")
        except Exception:
            if unsent and returned:
                with self._lock:
                    self._returns[:0] = returned  # given back with the next claim
            self._claim_errors += 1
            logger.exception("claim failed; retrying after the poll interval")
            if self.options.burst and self._claim_errors >= 5:
                # "Nothing claimable" must not be mistaken for "cannot claim".
                raise RuntimeError(
                    "claims keep failing; giving up (see the errors above)"
                ) from None
            return 0
        finally:
            release_connection()
        self._claim_errors = 0
        for claimed in runs:
            control = RunControl()
            with self._lock:
                self._held[claimed.lease_token] = Held(run_id=claimed.id, control=control)
            self._pool.submit(contextvars.copy_context().run, self._execute, claimed, control)
        return len(runs)

    def _execute(self, claimed, control: RunControl) -> None:
        try:
            RunExecutor(self, claimed, control).execute()
        except BaseException:
            logger.exception("executor crashed on run %s", claimed.id)
        finally:
            with self._lock:
                self._held.pop(claimed.lease_token, None)
            self._wake.set()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._held)

    def _shutdown(self) -> None:
        self.stopping.set()
        # In-flight runs finish their current step and release themselves
        # (ctx.step raises ReleaseRun before starting another one).
        self._pool.shutdown(wait=True)
        self.committer.stop()
        self.defers_slot_returns = False
        self.give_slots_back()
        if self._listener is not None:
            self._listener.stop()
        try:
            worker_stopped(worker_id=self.id)
        finally:
            release_connection()
        logger.info("worker %s stopped", self.id)

    def _install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: self.stop())

    def _register(self) -> None:
        try:
            register_worker(
                worker_id=self.id,
                queues=self.options.queues,
                kinds=list(self.kinds),
                concurrency=self.options.concurrency,
                lease=self.lease,
            )
        finally:
            release_connection()

    # Steps that never return.
    def watch_stuck_step(self, thread: threading.Thread, timeout: float) -> None:
        """A step outlived its timeout; if its thread is still alive after the grace period, give up the process."""
        with self._lock:
            self._stuck.append((thread, time.monotonic() + settings.RUNS_STEP_GRACE_SECONDS))
        self._wake.set()

    def _check_stuck_steps(self) -> None:
        now = time.monotonic()
        with self._lock:
            self._stuck = [(t, limit) for t, limit in self._stuck if t.is_alive()]
            hopeless = [t for t, limit in self._stuck if now > limit]
        if hopeless and not self.poisoned:
            # A thread cannot be killed: release the other runs and exit, so
            # that the supervisor starts a clean process.
            logger.error(
                "step thread %s never returned; releasing runs and exiting for a restart",
                hopeless[0].name,
            )
            self.poisoned = True
            self.stop()

    # Leases.
    def lease_is_fresh(self) -> bool:
        """False once heartbeats have failed for lease - heartbeat seconds: start nothing new then."""
        return time.monotonic() - self._last_heartbeat_ok < self.lease - self.options.heartbeat

    def _heartbeat_loop(self) -> None:
        while True:
            self._beat_now.wait(self.options.heartbeat)
            self._beat_now.clear()
            if self.stopping.is_set() and self.in_flight() == 0:
                return
            self.heartbeat_once()

    def _control(self) -> None:
        """A person cancelled or paused a run, or the reaper stopped one: beat now, and read the runs held."""
        self._check_runs = True
        self._beat_now.set()

    def heartbeat_once(self) -> None:
        with self._lock:
            held = {token: h.run_id for token, h in self._held.items()}
        check, self._check_runs = self._check_runs, False
        try:
            alive = claims.heartbeat(worker_id=self.id, held=held, lease=self.lease, check=check)
        except Exception:
            self._check_runs = self._check_runs or check
            logger.exception("heartbeat failed")
            return
        finally:
            release_connection()
        self._last_heartbeat_ok = time.monotonic()
        with self._lock:
            for token, h in self._held.items():
                if token not in held:
                    continue  # claimed after the heartbeat read the list
                flags = alive.get(token)
                if flags is None:
                    if not h.control.leaving.is_set():
                        logger.warning("lease lost on run %s; abandoning it", h.run_id)
                        h.control.lease_lost.set()
                    continue
                cancel, pause = flags
                h.control.note(cancel=cancel, pause=pause)

    def notify_released(self, run_queue: str) -> None:
        """A run went back to the queue ready to run: wake other workers (and this one)."""
        self._wake.set()
        try:
            notify_queues([run_queue])
        except Exception:
            logger.exception("notify failed")
        finally:
            release_connection()
