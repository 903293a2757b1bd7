"""A worker on another host is cut off from PostgreSQL mid-run: its runs are rescued, its late writes refused.

Each worker runs in a network namespace the test makes (``ip netns``), with
a veth pair to the host, where the test's own PostgreSQL listens
(tests/support/pgcluster.py): two hosts as far as the network goes. Both
run the ``effect`` kind, whose ``charge`` step is a keyed side effect on an
idempotent ledger (a table whose primary key is the idempotency key) and
then blocks, so that every run is inside its effect when the partition
comes. One worker's link is then cut (the veth's host end set down: every
packet either way is dropped, its TCP connections hang): its leases expire,
the reaper on the host rescues its runs, and the other worker claims and
finishes them, calling the charge again with the same key. When the link
comes back, the cut-off worker's writes that were waiting (checkpoints of
steps it finished meanwhile, exits) reach the server and are refused: the
lease token they carry is not the run's any more.

Then: every run is done, each charged once (one ledger row per run, the
key the same for both executions); the refused writes are counted from the
cut-off worker's log; the figures are printed. Skipped with the reason
where the kernel or the user may not make namespaces.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import textwrap
import time

import psycopg
import pytest

from tests.support.agents import LEDGER_TABLE
from tests.support.pgcluster import Cluster
from tests.support.waiting import wait_until

RUNS = 8
LEASE = 4
WORKER_ARGS = ("--lease", str(LEASE), "--heartbeat", "1", "--poll", "0.2")
NET = "10.213"  # the namespaces' links: 10.213.<n>.1 on the host, 10.213.<n>.2 inside


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Host:
    """A network namespace joined to this machine by a veth pair: a host of its own for a process."""

    def __init__(self, n: int):
        tag = f"{os.getpid() % 100000}{n}"
        self.name = f"agr{tag}"
        self.outer = f"agr{tag}h"  # the host's end
        self.address = f"{NET}.{n}.2"
        self.gateway = f"{NET}.{n}.1"
        ip("netns", "add", self.name)
        try:
            ip("link", "add", self.outer, "type", "veth", "peer", "name", f"agr{tag}n")
            ip("link", "set", f"agr{tag}n", "netns", self.name)
            ip("addr", "add", f"{self.gateway}/24", "dev", self.outer)
            ip("link", "set", self.outer, "up")
            inside = ("netns", "exec", self.name, "ip")
            ip(*inside, "addr", "add", f"{self.address}/24", "dev", f"agr{tag}n")
            ip(*inside, "link", "set", f"agr{tag}n", "up")
            ip(*inside, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise

    @property
    def wrap(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.name)

    def cut(self) -> None:
        ip("link", "set", self.outer, "down")

    def heal(self) -> None:
        ip("link", "set", self.outer, "up")

    def remove(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        subprocess.run(["ip", "link", "del", self.outer], capture_output=True, timeout=30)


@pytest.fixture
def hosts():
    made: list[Host] = []
    try:
        for n in (1, 2):
            made.append(Host(n))
    except (subprocess.CalledProcessError, FileNotFoundError, PermissionError) as exc:
        for host in made:
            host.remove()
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"network namespaces cannot be made here: {str(detail).strip()}")
    yield made
    for host in made:
        host.remove()


@pytest.fixture
def server(tmp_path, hosts):
    cluster = Cluster(
        tmp_path / "pg",
        settings={"listen_addresses": "*"},
        hba=(f"host all all {NET}.0.0/16 trust",),
    ).start()
    yield cluster
    cluster.kill()


def one(url: str, query: str, *params):
    with psycopg.connect(url, connect_timeout=3) as conn:
        return conn.execute(query, params).fetchone()


def test_a_worker_cut_off_mid_run_is_rescued_from_and_its_late_writes_are_refused(
    processes, hosts, server, tmp_path
):
    cut_off, other = hosts
    url = server.create_database("partition")
    migrated = processes.run("migrate", "-v0", timeout=300, DATABASE_URL=url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    created = processes.run("createtenant", "acme", "--max-running", "100", DATABASE_URL=url)
    assert created.returncode == 0, created.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {LEDGER_TABLE} "
            "(key text PRIMARY KEY, run_id text NOT NULL, pid integer NOT NULL, amount integer NOT NULL)"
        )
    block = tmp_path / "block"
    block.touch()
    log = tmp_path / "effects.jsonl"
    submitted = processes.run(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from runs.models import Tenant
            from runs.services import submit_run
            tenant = Tenant.objects.get(slug="acme")
            for _ in range({RUNS}):
                run = submit_run(tenant=tenant, kind="effect",
                                 input={{"log": {str(log)!r}, "keyed": True, "block_file": {str(block)!r}}})
                print("RUN", run.id)
            """
        ),
        DATABASE_URL=url,
    )
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    ids = re.findall(r"RUN (\S+)", submitted.stdout)
    assert len(ids) == RUNS

    def via(host) -> str:
        return url.replace("127.0.0.1", host.gateway)

    # The worker to be cut off takes half the runs; the other, started then, the rest.
    doomed = processes.worker(
        *WORKER_ARGS, "--concurrency", str(RUNS // 2), wrap=cut_off.wrap, DATABASE_URL=via(cut_off)
    )
    charged = f"SELECT count(*) FROM {LEDGER_TABLE}"
    wait_until(
        lambda: one(url, charged)[0] == RUNS // 2,
        timeout=60,
        what="the first worker inside the charge of half the runs",
    )
    survivor = processes.worker(
        *WORKER_ARGS, "--concurrency", str(RUNS), wrap=other.wrap, DATABASE_URL=via(other)
    )
    wait_until(lambda: one(url, charged)[0] == RUNS, timeout=60, what="every run inside its charge")
    reaper = processes.manage("reap", "--interval", "1", DATABASE_URL=url)

    cut_off.cut()
    cut_at = time.monotonic()
    rescued = "SELECT count(*) FROM runs_event WHERE payload->>'reason' = 'lease_expired'"
    wait_until(
        lambda: one(url, rescued)[0] == RUNS // 2,
        timeout=60,
        what=lambda: f"the cut-off worker's runs rescued ({one(url, rescued)[0]} are)",
    )
    rescue_seconds = time.monotonic() - cut_at
    block.unlink()  # every charge returns: the survivor's, and the cut-off worker's in the dark
    done = "SELECT count(*) FROM runs_run WHERE status = 'done'"
    wait_until(lambda: one(url, done)[0] == RUNS, timeout=60, what="every run done")
    time.sleep(2)  # the cut-off worker's steps finish meanwhile and wait for the link
    cut_off.heal()

    # The runs the cut-off worker found it had lost once it could reach the server again: by a
    # checkpoint refused (its lease token is not the run's any more), or by its heartbeat, which
    # finds its own lease had lapsed and reads which of its runs are still its own.
    [rescued_ids] = one(
        url,
        "SELECT array_agg(run_id::text) FROM runs_event WHERE payload->>'reason' = 'lease_expired'",
    )
    lost_runs = set(rescued_ids)

    def found_lost() -> set[str]:
        text = processes.output(doomed)
        return set(
            re.findall(r"lease lost while checkpointing .* run_id=(\S+)", text)
            + re.findall(r"lease lost on run (\S+);", text)
        )

    wait_until(
        lambda: found_lost() == lost_runs,
        timeout=120,
        interval=0.5,
        what=lambda: f"the cut-off worker to find its {len(lost_runs)} runs lost ({found_lost()})",
    )
    refused = len(re.findall(r"lease lost while checkpointing", processes.output(doomed)))
    assert doomed.poll() is None, processes.output(doomed)

    # Nothing lost, nothing charged twice, and the runs are the survivor's.
    assert one(url, done)[0] == RUNS
    [rows, keys, runs] = one(
        url, f"SELECT count(*), count(DISTINCT key), count(DISTINCT run_id) FROM {LEDGER_TABLE}"
    )
    assert (rows, keys, runs) == (RUNS, RUNS, RUNS)
    [twice] = one(url, "SELECT count(*) FROM runs_run WHERE attempt = 2")
    assert twice == RUNS // 2
    print(
        f"partition: {RUNS} runs, {RUNS // 2} on the cut-off worker rescued "
        f"{rescue_seconds:.1f} s after the cut (lease {LEASE} s) and finished by the other; "
        f"0 lost, each charged once ({rows} ledger rows); after the link came back the cut-off "
        f"worker found its {len(lost_runs)} runs lost, {refused} of them by a checkpoint refused"
    )
    for proc in (doomed, survivor):
        proc.send_signal(signal.SIGTERM)
    for proc in (doomed, survivor):
        assert proc.wait(60) == 0, processes.output(proc)
    assert reaper.poll() is None, processes.output(reaper)
    # Stopped, the workers gave their slots back: the tenant's counter is true again.
    assert one(url, "SELECT running FROM runs_tenant WHERE slug = 'acme'")[0] == 0
