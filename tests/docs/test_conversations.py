"""docs/how-to/conversations.md: its kind plays turns and its curl talks to it, as written.

The kind is the page's block, written to a folder on ``PYTHONPATH`` and run by a real worker
process; the ``curl`` block runs in ``bash`` against a real web server (``manage.py serve``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import httpx
import pytest

from runs.models import Message, Run, Thread
from runs.seed import seed_demo
from tests import conftest
from tests.conftest import ROOT, free_port
from tests.docs.markdown import marked_blocks
from tests.support.waiting import wait_until

PAGE = ROOT / "docs" / "how-to" / "conversations.md"

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_guides_kind_and_curl_hold_a_conversation(processes, tmp_path):
    blocks = marked_blocks(PAGE, "conversations")
    (tmp_path / "concierge.py").write_text(blocks["agent"])
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    (tmp_path / "manage.py").symlink_to(ROOT / "manage.py")
    modules = {"AGENT_MODULES": "concierge", "PYTHONPATH": str(tmp_path)}
    seed_demo()

    port = free_port()
    processes.manage("serve", f"127.0.0.1:{port}", DEBUG="1", **modules)
    worker = processes.worker("--poll", "0.2", DEBUG="1", **modules)

    def healthy():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(healthy, timeout=60, interval=0.2, what="the web server")
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
    posted = json.loads(answer.stdout)
    assert posted["delivered"] in {"queued_turn", "new_turn"}, answer.stdout + answer.stderr
    thread = Thread.objects.get(kind="concierge")
    assert (thread.kind, thread.title, thread.policy) == ("concierge", "Order 1042", "enqueue")
    wait_until(
        lambda: (
            Thread.objects.get(pk=thread.pk).status == "asleep"
            and Run.objects.filter(thread=thread, status="done").count() == 2
        ),
        timeout=30,
        what=lambda: f"both turns to end: {processes.output(worker)}",
    )
    thread.refresh_from_db()
    assert thread.state == {"seen": 2, "last": "It was due on Monday"}
    replies = list(
        Message.objects.filter(thread=thread, author_type="agent")
        .order_by("id")
        .values_list("text", flat=True)
    )
    assert replies == [
        "Turn 1: noted Where is my order? (1 lines so far)",
        "Turn 2: noted It was due on Monday (3 lines so far)",
    ]
