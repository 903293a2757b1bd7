"""Management commands as an operator runs them: real processes, real database."""

from __future__ import annotations

import json
import signal
import urllib.request

import pytest

from runs.keys import authenticate_key
from runs.models import Run, Tenant
from tests.conftest import free_port
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_createtenant_is_idempotent_and_createapikey_prints_the_secret_last(processes):
    first = processes.run("createtenant", "acme", "--name", "Acme", "--max-running", "7")
    assert first.returncode == 0, first.stderr
    again = processes.run("createtenant", "acme", "--max-queued", "50")
    assert again.returncode == 0, again.stderr
    assert "exists" in again.stdout
    tenant = Tenant.objects.get(slug="acme")
    assert (tenant.name, tenant.max_running, tenant.max_queued) == ("Acme", 7, 50)
    weighted = processes.run("createtenant", "acme", "--weight", "3")
    assert weighted.returncode == 0, weighted.stderr
    assert "max_running 7, max_queued 50, weight 3" in weighted.stdout
    for option, value in (("--weight", "0"), ("--max-running", "-1")):
        refused = processes.run("createtenant", "other", option, value)
        assert refused.returncode != 0
        assert "at least" in refused.stderr
    assert not Tenant.objects.filter(slug="other").exists()  # refused before anything was written
    tenant.refresh_from_db()

    out = processes.run("createapikey", "acme", "--scopes", "runs:read")
    assert out.returncode == 0, out.stderr
    secret = out.stdout.strip().splitlines()[-1]
    key = authenticate_key(secret)
    assert key is not None and key.tenant == tenant and key.scopes == ["runs:read"]
    assert secret not in str(key.secret_sha256)

    missing = processes.run("createapikey", "nope")
    assert missing.returncode != 0
    assert "no tenant 'nope'" in missing.stderr
    bad_scope = processes.run("createapikey", "acme", "--scopes", "runs:everything")
    assert bad_scope.returncode != 0
    assert "unknown scopes" in bad_scope.stderr


def http(method, url, key=None, body=None):
    request = urllib.request.Request(
        url, method=method, data=json.dumps(body).encode() if body else None
    )
    request.add_header("Content-Type", "application/json")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, json.loads(response.read())


def test_up_serves_the_api_runs_a_worker_and_stops_on_ctrl_c(processes):
    port = free_port()
    up = processes.manage("up", f"127.0.0.1:{port}", RUNS_DEMO_DELAY_SCALE="0.01")
    base = f"http://127.0.0.1:{port}"

    def healthy():
        try:
            return http("GET", f"{base}/api/health")[1] == {"status": "ok"}
        except OSError:
            return False

    wait_until(healthy, timeout=60, interval=0.2, what="the web server of `up`")
    key = wait_until(lambda: _printed_key(processes.output(up)), what="the printed API key")
    status, body = http(
        "POST", f"{base}/api/runs", key, {"kind": "research_brief", "input": {"topic": "Acme"}}
    )
    assert status == 202
    wait_until(
        lambda: http("GET", f"{base}/api/runs/{body['id']}", key)[1]["status"] == "done",
        timeout=60,
        what="the demo run to finish",
    )
    run = Run.objects.get(pk=body["id"])
    assert run.result["topic"] == "Acme"
    assert run.steps_done == run.steps_total == 7
    # Django's task API works out of the box, and the demo user sees the tasks' tenant on the dashboard.
    from examples.crm.tasks import pipeline_report
    from runs.models import Membership

    task = pipeline_report.enqueue("demo")
    wait_until(
        lambda: pipeline_report.get_result(task.id).is_finished,
        timeout=60,
        what="the task to run",
    )
    # The demo leads are the demo tenant's (RUNS_EXAMPLES=1, as `make run` sets it).
    assert pipeline_report.get_result(task.id).return_value == {
        "new": 1,
        "contacted": 1,
        "qualified": 0,
        "proposal": 1,
        "won": 0,
        "lost": 0,
    }
    assert set(
        Membership.objects.filter(user__username="demo").values_list("tenant__slug", flat=True)
    ) == {"demo", "tasks"}

    up.send_signal(signal.SIGINT)
    assert up.wait(60) == 0, processes.output(up)
    with pytest.raises(OSError):
        http("GET", f"{base}/api/health")


def _printed_key(output: str) -> str | None:
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("API key for tenant") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return None
