"""README.md: short, its links lead somewhere, and its first agent and its `curl` work as written.

The agent is the README's block, written to a folder on ``PYTHONPATH`` and run by a real worker
process; the ``curl`` block runs in ``bash`` against a real web server (``manage.py serve``, what
``make run`` serves with), on a free port instead of 8000.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import httpx
import pytest

from runs.models import Run, Step
from runs.seed import seed_demo
from tests import conftest
from tests.conftest import ROOT, free_port
from tests.docs.markdown import marked_blocks, relative_links
from tests.support.waiting import wait_until

README = ROOT / "README.md"


def test_the_readme_stays_short():
    lines = README.read_text().count("\n")
    assert lines < 250, f"README.md has {lines} lines; the rest belongs on the site (docs/)"


def test_the_readmes_relative_links_point_at_files_that_exist():
    links = relative_links(README)
    assert "docs/tutorial.md" in links
    missing = [link for link in links if not (ROOT / link).exists()]
    assert not missing, missing


@pytest.mark.django_db(transaction=True)
def test_the_readmes_first_agent_runs_and_its_curl_answers_202(processes, tmp_path):
    blocks = marked_blocks(README, "readme")
    assert blocks["start"].strip() == "AGENT_MODULES=hello make run"
    (tmp_path / "hello.py").write_text(blocks["agent"])
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "manage.py").symlink_to(ROOT / "manage.py")
    modules = {"AGENT_MODULES": "hello", "PYTHONPATH": str(tmp_path)}
    seed_demo()  # the tenant `make run` seeds

    port = free_port()
    processes.manage("serve", f"127.0.0.1:{port}", DEBUG="1", **modules)
    worker = processes.worker("--poll", "0.2", DEBUG="1", **modules)

    def healthy():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout=60, interval=0.2, what="the web server")

    # The reader's shell: none of the test session's settings.
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"SECRET_KEY", "AGENT_MODULES", "RUNS_EXAMPLES", "DEBUG"}
    }
    env["DATABASE_URL"] = conftest.test_database_url()
    curl = re.sub(r"\b8000\b", str(port), blocks["curl"])
    answer = subprocess.run(
        ["bash", "-c", curl],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    head, _, body = answer.stdout.replace("\r\n", "\n").partition("\n\n")
    assert head.startswith("HTTP/1.1 202 Accepted"), answer.stdout + answer.stderr
    run = json.loads(body)
    assert (run["kind"], run["status"]) == ("hello", "queued")

    wait_until(
        lambda: Run.objects.get(pk=run["id"]).status == "done",
        timeout=30,
        what=lambda: f"the README's run to finish: {processes.output(worker)}",
    )
    done = Run.objects.get(pk=run["id"])
    assert done.result == {"greeting": "Hello, Ada!", "loud": "HELLO, ADA!"}
    assert list(
        Step.objects.filter(run=done).order_by("seq").values_list("name", "executions")
    ) == [
        ("greet", 1),
        ("shout", 1),
    ]
