"""Structured logs of a real worker process: JSON lines that say which run, step, attempt and worker wrote them."""

from __future__ import annotations

import json

import pytest

from runs.models import Run, Worker
from runs.services import submit_run
from tests.conftest import fresh

pytestmark = pytest.mark.django_db(transaction=True)

RUN_FIELDS = ("run_id", "tenant", "kind", "attempt", "worker")


def json_lines(output: str) -> list[dict]:
    """Every line the process wrote, each parsed as one JSON object (a line that is not fails the test)."""
    lines = []
    for number, line in enumerate(output.splitlines(), 1):
        try:
            parsed = json.loads(line)
        except ValueError:
            pytest.fail(f"line {number} is not JSON: {line!r}\n\n{output}")
        assert isinstance(parsed, dict), line
        lines.append(parsed)
    return lines


def the_line(lines: list[dict], event: str) -> dict:
    found = [line for line in lines if line.get("event") == event]
    assert len(found) == 1, (event, lines)
    return found[0]


def test_json_lines_of_a_worker_carry_the_run_the_step_the_attempt_and_the_worker(
    tenant, processes
):
    # Two runs, one after the other on the one pool thread: each line carries its own run, and the
    # step's fields only while the step runs.
    ada = submit_run(tenant=tenant, kind="logs_in_step", input={"name": "Ada"})
    bob = submit_run(tenant=tenant, kind="logs_in_step", input={"name": "Bob"})
    proc = processes.worker("--burst", "--concurrency", "1", RUNS_LOG_FORMAT="json")
    assert proc.wait(60) == 0, processes.output(proc)
    assert fresh(ada).status == fresh(bob).status == "done"
    worker_id = str(Worker.objects.get(pid=proc.pid).id)

    lines = json_lines(processes.output(proc))

    for run, name in ((ada, "Ada"), (bob, "Bob")):
        inside = the_line(
            lines, f"greeting {name} from inside the step"
        )  # logged on the step's thread
        assert {key: inside.get(key) for key in (*RUN_FIELDS, "step", "seq")} == {
            "run_id": str(run.id),
            "tenant": str(tenant.id),
            "kind": "logs_in_step",
            "attempt": 1,
            "worker": worker_id,
            "step": "greet",
            "seq": 1,
        }
        assert (inside["logger"], inside["level"]) == ("tests.support.agents", "info")
        assert inside["timestamp"].endswith("Z")
        between = the_line(
            lines, f"greeted {name}, between steps"
        )  # the run's thread, after the step
        assert between["run_id"] == str(run.id) and between["worker"] == worker_id
        assert "step" not in between and "seq" not in between, between
    assert Run.objects.get(pk=bob.pk).attempt == 1

    # The worker loop's own lines say which worker wrote them, and name no run.
    started = [line for line in lines if line["event"].startswith(f"worker {worker_id} started")]
    stopped = [line for line in lines if line["event"] == f"worker {worker_id} stopped"]
    for line in started + stopped:
        assert line["worker"] == worker_id and line["logger"] == "workers.worker"
        assert not {"run_id", "step", "kind"} & set(line), line
    assert len(started) == len(stopped) == 1


def test_in_debug_the_console_lines_are_readable_text_with_the_fields(tenant, processes):
    run = submit_run(tenant=tenant, kind="logs_in_step", input={"name": "Ada"})
    # No RUNS_LOG_FORMAT: DEBUG picks the console.
    proc = processes.worker("--burst", DEBUG="1", RUNS_LOG_FORMAT="")
    assert proc.wait(60) == 0, processes.output(proc)
    output = processes.output(proc)

    [line] = [line for line in output.splitlines() if "greeting Ada from inside the step" in line]
    assert " INFO tests.support.agents greeting Ada from inside the step " in line, line
    assert f"run_id={run.id}" in line and "step=greet" in line and "attempt=1" in line, line
    assert not line.startswith("{") and "\x1b[" not in output, output


def test_an_unknown_log_format_is_refused_with_a_readable_reason(processes):
    result = processes.run("check", RUNS_LOG_FORMAT="xml")
    assert result.returncode != 0
    assert "RUNS_LOG_FORMAT must be one of json, console, not 'xml'" in result.stderr, result.stderr
