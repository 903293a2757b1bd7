"""Login storm benchmark: another tenant's ``GET /api/runs`` while 24 logins hash passwords at once (issue 25).

    .venv/bin/python bench/login_storm.py                    # 24 concurrent logins for 10 s
    .venv/bin/python bench/login_storm.py --logins 48 --seconds 20
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/login_storm.py

Like the other benchmarks it uses DATABASE_URL or the embedded PostgreSQL and
works in a database ``bench_<pid>`` of its own, dropped at the end. It starts
one real ``manage.py serve 127.0.0.1:<free port>`` (one process, its default
request threads), creates a tenant with 50 runs and a read-only API key, and
measures that tenant's ``GET /api/runs?limit=20`` one request after another:
first for ``--seconds`` alone (the baseline), then for ``--seconds`` while
``--logins`` threads each post the dashboard's login form in a loop, every
attempt with a wrong password for a username of its own (unknown usernames
are hashed too, and distinct ones are never locked out: the storm a password
sprayer makes, which throttling per username cannot stop). It prints the
median and maximum API latency of each phase and how the logins were answered
(200: the password was checked and refused; 503: refused at once, unchecked).

The client runs on the same cores as the server and PostgreSQL: the figures
include that contention. It runs on any commit with ``manage.py serve``, so
before and after a change can be compared on the same machine.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Children, Database, say  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_api(httpx, url: str, key: str, seconds: float) -> list[float]:
    """Latencies (ms) of back-to-back GET /api/runs for ``seconds``."""
    latencies = []
    with httpx.Client(headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            response = client.get(url)
            latencies.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.text[:300]
            time.sleep(0.02)
    return latencies


def storm(
    httpx, base: str, logins: int, stop: threading.Event, answers: Counter
) -> list[threading.Thread]:
    """``logins`` threads posting the login form with wrong passwords until ``stop`` is set."""
    start = threading.Barrier(logins + 1)

    def attempts(n: int) -> None:
        with httpx.Client(timeout=120) as client:
            form = client.get(base + "/accounts/login/")
            csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
            start.wait()
            i = 0
            while not stop.is_set():
                i += 1
                response = client.post(
                    base + "/accounts/login/",
                    data={
                        "username": f"storm-{n}-{i}",
                        "password": "wrong-password",
                        "csrfmiddlewaretoken": csrf,
                    },
                )
                answers[response.status_code] += 1
                if response.status_code == 503:
                    time.sleep(float(response.headers.get("Retry-After", "1")))

    threads = [threading.Thread(target=attempts, args=(n,), daemon=True) for n in range(logins)]
    for thread in threads:
        thread.start()
    start.wait()
    return threads


def summary(name: str, latencies: list[float]) -> str:
    return (
        f"{name:<22} {len(latencies):>5} requests   median {statistics.median(latencies):8.1f} ms"
        f"   max {max(latencies):8.1f} ms"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--logins", type=int, default=24, help="concurrent login attempts (default 24)"
    )
    parser.add_argument(
        "--seconds", type=float, default=10, help="length of each phase (default 10)"
    )
    args = parser.parse_args()

    import httpx

    db = Database(agent_modules="bench.agents")
    db.setup()
    children = Children(Path(tempfile.mkdtemp(prefix="login-storm-")), env=os.environ.copy())
    try:
        from runs.keys import create_api_key
        from runs.models import Tenant
        from runs.services import submit_run

        tenant = Tenant.objects.create(name="API tenant", slug="api-tenant")
        for n in range(50):
            submit_run(tenant=tenant, kind="bench_noop", input={"n": n})
        key = create_api_key(tenant=tenant, name="bench", scopes=["runs:read"]).secret

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        serve = children.start("serve", [sys.executable, "manage.py", "serve", f"127.0.0.1:{port}"])
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/api/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or serve.poll() is not None:
                say(children.tail(serve))
                return 1
            time.sleep(0.2)

        url = base + "/api/runs?limit=20"
        measure_api(httpx, url, key, 1)  # warm-up
        say(
            f"login storm: {args.logins} concurrent logins, {args.seconds:g} s per phase, "
            f"{os.cpu_count()} cores, RUNS_LOGIN_CONCURRENCY={os.environ.get('RUNS_LOGIN_CONCURRENCY', 'default')}"
        )
        alone = measure_api(httpx, url, key, args.seconds)
        say(summary("GET /api/runs alone", alone))

        stop, answers = threading.Event(), Counter()
        threads = storm(httpx, base, args.logins, stop, answers)
        during = measure_api(httpx, url, key, args.seconds)
        stop.set()
        for thread in threads:
            thread.join(120)
        say(summary("GET /api/runs in storm", during))
        say(
            "login answers: "
            + ", ".join(f"{status}: {count}" for status, count in sorted(answers.items()))
        )
        return 0
    finally:
        children.stop()
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
