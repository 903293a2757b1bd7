"""docs/tutorial.md, run as written: its files, its commands, its four terminals.

Each marked block of the page (``<!-- tutorial: name -->``) is used as it is, with two changes that
let the test run beside anything else on the machine: the ports 8000 and 9000 become free loopback
ports, and ``make run`` becomes the command its Makefile recipe runs (``manage.py up``) with the
web server's address. Each terminal is a real ``bash`` fed the page's lines, so ``export``, ``&`` and
``$!`` work as they do for a reader; the processes it starts (``manage.py up`` with its web server,
worker, reaper and webhook sender, the reader's worker, the webhook receiver) use the test database.
The reader's files are written to a folder of the test's own, on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from runs.models import Run, Step, WebhookDelivery
from tests import conftest
from tests.conftest import ROOT, free_port
from tests.docs.markdown import marked_blocks
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PAGE = ROOT / "docs" / "tutorial.md"


class Terminal:
    """A ``bash`` reading the commands a reader types; its output goes to a log file."""

    def __init__(self, name: str, cwd: Path, env: dict[str, str]):
        self.name = name
        self.log_path = cwd / f"terminal-{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            ["bash"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: everything it starts stops with it
        )

    def type(self, commands: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(commands.encode() + b"\n")
        self.proc.stdin.flush()

    def run(self, commands: str, *, timeout: float = 30) -> str:
        """Type ``commands`` and return what they printed once they are done."""
        marker = f"__done_{uuid.uuid4().hex}__"
        start = len(self.output())
        self.type(f"{commands}\necho {marker}")
        wait_until(
            lambda: marker in self.output()[start:],
            timeout=timeout,
            interval=0.1,
            what=lambda: f"terminal {self.name} to run:\n{commands}\n{self.output()[start:]}",
        )
        return self.output()[start:].split(marker)[0]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        """SIGTERM to the terminal's process group (Ctrl-C for all it started), SIGKILL if it lingers."""
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self.proc.poll()  # reaps bash: a zombie would still count as a member of the group
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)
        self.log.close()


@pytest.fixture
def terminals(tmp_path):
    opened: list[Terminal] = []
    env = os.environ.copy()
    # What a reader's shell has: none of the test session's settings (its SECRET_KEY, AGENT_MODULES...).
    for name in (
        "AGENT_MODULES",
        "RUNS_EXAMPLES",
        "SECRET_KEY",
        "SECURE_SSL_REDIRECT",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_HSTS_SECONDS",
        "RUNS_LOG_FORMAT",
        "DEBUG",
    ):
        env.pop(name, None)
    env.update(
        DATABASE_URL=conftest.test_database_url(),
        PYTHONPATH=str(tmp_path),  # the reader's module, where they wrote it
        PYTHONUNBUFFERED="1",
    )
    # The reader is in the clone: .venv and manage.py are where the page's commands look for them.
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "manage.py").symlink_to(ROOT / "manage.py")

    def open_terminal(name: str) -> Terminal:
        terminal = Terminal(name, tmp_path, env)
        opened.append(terminal)
        return terminal

    yield open_terminal
    for terminal in reversed(opened):
        terminal.close()


def with_ports(text: str, web: int, hook: int) -> str:
    return re.sub(r"\b9000\b", str(hook), re.sub(r"\b8000\b", str(web), text))


def test_the_tutorial_runs_as_written(terminals, tmp_path):
    blocks = marked_blocks(PAGE, "tutorial")
    web, hook = free_port(), free_port()
    for name, code in blocks.items():
        if name.startswith("file "):
            (tmp_path / name.removeprefix("file ")).write_text(with_ports(code, web, hook))
    page = {name: with_ports(code, web, hook) for name, code in blocks.items()}
    base = f"http://127.0.0.1:{web}"

    # `make run` is its recipe, `manage.py up`, on a free port (and the tutorial's exports before it).
    recipe = (ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "RUNS_EXAMPLES=$${RUNS_EXAMPLES:-1} $(VPY) manage.py up" in recipe
    assert page["start"].rstrip().endswith("\nmake run")
    up = terminals("1")
    up.type(
        page["start"].replace(
            "\nmake run", f"\nRUNS_EXAMPLES=1 .venv/bin/python manage.py up 127.0.0.1:{web}"
        )
    )

    def healthy():
        try:
            return httpx.get(f"{base}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(
        healthy,
        timeout=60,
        interval=0.2,
        what=lambda: f"the web server of `make run`: {up.output()}",
    )
    assert f"Dashboard: {base}/  (log in as demo / demo)" in up.output()
    assert "API key for tenant demo:" in up.output()

    receiver = terminals("2")
    receiver.type(page["receiver"])
    wait_until(
        lambda: f"listening on http://127.0.0.1:{hook}/" in receiver.output(),
        timeout=30,
        what=lambda: f"the webhook receiver: {receiver.output()}",
    )

    worker = terminals("3")
    worker.type(page["worker"])
    wait_until(
        lambda: re.search(
            r"worker \S+ started: queues=tutorial .*kinds=.*write_post", worker.output()
        ),
        timeout=30,
        what=lambda: f"the reader's worker to start: {worker.output()}",
    )

    client = terminals("4")
    assert client.run(page["key"]) == ""
    submitted = client.run(page["submit"])
    assert submitted.splitlines()[0] == "202", submitted
    run_id = json.loads((tmp_path / "run.json").read_text())["id"]
    assert json.loads(submitted.split("\n", 1)[1]) == {
        "id": run_id,
        "kind": "write_post",
        "status": "queued",
    }

    wait_until(
        lambda: Run.objects.get(pk=run_id).status == "waiting_human",
        timeout=30,
        what=lambda: "the run to wait for approval (it is {0.status}: {0.error})".format(
            Run.objects.get(pk=run_id)
        ),
    )
    waiting = json.loads(client.run(page["status"]))
    assert (waiting["status"], waiting["current_step"]) == ("waiting_human", "approve_outline")
    assert waiting["waiting_for"]["type"] == "approval"
    wait_until(
        lambda: f"verified run.waiting_human {run_id} waiting_human" in receiver.output(),
        timeout=30,
        what=lambda: f"the run.waiting_human webhook: {receiver.output()}",
    )
    assert json.loads(client.run(page["approve"]))["status"] == "queued"

    # Kill the worker inside section 2, with section 1 published.
    wait_until(
        lambda: Step.objects.filter(run_id=run_id, name="section 2", status="running").exists(),
        timeout=30,
        what="section 2 to start",
    )
    worker.run(page["kill"])
    killed = Run.objects.get(pk=run_id)
    assert (killed.status, killed.current_step) == ("running", "section 2")
    wait_until(
        lambda: Run.objects.get(pk=run_id).status == "queued",
        timeout=40,
        interval=0.2,
        what="the reaper to put the run back in the queue",
    )
    worker.type(page["worker-again"])
    wait_until(
        lambda: Run.objects.get(pk=run_id).status == "done",
        timeout=40,
        interval=0.2,
        what=lambda: f"the run to finish: {worker.output()}",
    )

    # The page's listing of the steps is what the API says.
    listing = client.run(page["steps"])
    assert listing == page["steps-output"], listing
    result = json.loads(client.run(page["result"]))
    assert (result["status"], result["attempt"]) == ("done", 3)
    assert result["result"]["published"] is True
    assert len(result["result"]["sections"]) == 3

    # The run.done webhook arrived, and the reader's receiver verified its signature.
    wait_until(
        lambda: f"verified run.done {run_id} done" in receiver.output(),
        timeout=30,
        what=lambda: f"the run.done webhook: {receiver.output()}",
    )
    assert "refused" not in receiver.output()
    assert WebhookDelivery.objects.filter(run_id=run_id, status="delivered").count() == 2

    # The dashboard shows the run, and the step that ran twice.
    with httpx.Client(base_url=base, timeout=10) as browser:
        form = browser.get("/accounts/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)[1]
        logged_in = browser.post(
            "/accounts/login/",
            data={"username": "demo", "password": "demo", "csrfmiddlewaretoken": token},
            headers={"Referer": f"{base}/accounts/login/"},
        )
        assert logged_in.status_code == 302, logged_in.text
        page_of_run = browser.get(f"/runs/{run_id}/")
        assert page_of_run.status_code == 200
        assert "2 executions" in page_of_run.text
