"""Reads from a replica (DATABASE_REPLICA_URL), with read-your-writes where a person would notice.

A primary and a streaming standby of the test's own (tests/support/pgcluster.py),
the standby applying what it receives 3 s late (``recovery_min_apply_delay``),
so that "the replica has not caught up yet" lasts long enough to be seen. A
real web process reads from the standby and writes to the primary
(config/replicas.py). Seen from outside:

- an API list read right after a run was submitted by another client does
  not show it yet, and shows it once the standby replays it: the reads do go
  to the replica;
- a run fetched right after its submit is found all the same (a 404 from the
  replica is asked of the primary again);
- a person who just logged in is logged in on the next page (a browser that
  wrote reads the primary until the replica has replayed its write), and a
  client that keeps cookies sees the run it just submitted in the list.
"""

from __future__ import annotations

import re
import textwrap

import httpx
import psycopg
import pytest

from tests.support.pgcluster import Cluster
from tests.support.waiting import wait_until
from tests.support.web import Web, bearer

DELAY = "3s"
PASSWORD = "a replica test password 1"


@pytest.fixture
def pair(tmp_path):
    primary = Cluster(tmp_path / "primary").start()
    standby = None
    try:
        standby = primary.standby(
            tmp_path / "standby", settings={"recovery_min_apply_delay": DELAY}
        ).start()
        yield primary, standby
    finally:
        for server in (primary, standby):
            if server is not None:
                server.kill()


def count(url: str, query: str, *params) -> int:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute(query, params).fetchone()[0]
    except psycopg.OperationalError:
        return -1  # not there yet (the database itself, on the standby)


def test_reads_go_to_the_replica_and_a_writer_reads_its_own_writes(processes, pair):
    primary, standby = pair
    url = primary.create_database("replicated")
    replica = standby.url("replicated")
    env = {"DATABASE_URL": url, "DATABASE_REPLICA_URL": replica}
    migrated = processes.run("migrate", "-v0", timeout=300, DATABASE_URL=url)
    assert migrated.returncode == 0, migrated.stdout + migrated.stderr
    assert processes.run("createtenant", "acme", DATABASE_URL=url).returncode == 0
    issued = processes.run("createapikey", "acme", DATABASE_URL=url)
    assert issued.returncode == 0, issued.stderr
    key = issued.stdout.strip().splitlines()[-1]
    made = processes.run(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from django.contrib.auth.models import User
            from runs.models import Tenant, Membership
            user = User.objects.create_user("ada", password={PASSWORD!r})
            Membership.objects.create(user=user, tenant=Tenant.objects.get(slug="acme"))
            """
        ),
        DATABASE_URL=url,
    )
    assert made.returncode == 0, made.stderr[-3000:]
    wait_until(
        lambda: count(replica, "SELECT count(*) FROM auth_user WHERE username = 'ada'") == 1,
        timeout=30,
        what="the standby to replay the setup",
    )
    web = Web(processes, **env).start()
    runs = f"{web.base}/api/runs"

    # Another client submits; an API read at once does not show the run yet: it reads the replica.
    submitted = httpx.post(
        runs, json={"kind": "echo", "input": {"text": "hi"}}, headers=bearer(key)
    )
    assert submitted.status_code == 202, submitted.text
    run_id = submitted.json()["id"]
    listed = httpx.get(runs, headers=bearer(key))
    assert listed.status_code == 200, listed.text
    assert run_id not in listed.text  # 3 s behind
    # Fetched by its id right away, it is found (the primary answers the replica's 404).
    fetched = httpx.get(f"{runs}/{run_id}", headers=bearer(key))
    assert (fetched.status_code, fetched.json()["id"]) == (200, run_id)
    # Once replayed, the list shows it.
    wait_until(
        lambda: run_id in httpx.get(runs, headers=bearer(key)).text,
        timeout=30,
        what="the run in the list, read from the replica",
    )

    # A client that keeps cookies (a browser) reads what it just wrote.
    with httpx.Client(headers=bearer(key)) as client:
        mine = client.post(runs, json={"kind": "echo", "input": {"text": "mine"}})
        assert mine.status_code == 202
        assert mine.json()["id"] in client.get(runs).text
        assert count(replica, "SELECT count(*) FROM runs_run WHERE id = %s", mine.json()["id"]) == 0

    # A person who just logged in is logged in on the next page: the session is on the primary only.
    with httpx.Client(timeout=30) as browser:
        form = browser.get(f"{web.base}/accounts/login/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)
        login = browser.post(
            f"{web.base}/accounts/login/",
            data={
                "username": "ada",
                "password": PASSWORD,
                "csrfmiddlewaretoken": csrf,
                "next": "/",
            },
        )
        assert login.status_code == 302, login.text
        page = browser.get(f"{web.base}/")
        assert page.status_code == 200, (page.status_code, page.headers.get("location"))
        assert "ada" in page.text
