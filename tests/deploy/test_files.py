"""The deploy files (deploy/) are true: the documented production environment passes `check --deploy`,
every unit and Procfile line runs a real command with options it accepts, and the Procfile's processes
serve a run end to end over HTTP and stop by themselves on SIGTERM within their unit's TimeoutStopSec.

Everything is read from the files themselves, so the documentation and the tests cannot drift apart.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.conf import settings
from django.core.management import get_commands, load_command_class
from django.core.management.base import CommandError

from tests.conftest import ROOT, free_port
from tests.conftest import test_database_url as database_url
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import Receiver
from workers.executor import EXIT_RETRY_SECONDS
from workers.webhooks import DeliveryLoop

DEPLOY = ROOT / "deploy"
ENV_EXAMPLE = DEPLOY / "agentruns.env.example"
UNITS = sorted(DEPLOY.glob("*.service"))
WORKER_INSTANCE = "default,short"  # what the template's %I stands for in these tests

# The production environment the README and the env file promise to document.
DOCUMENTED = {
    "DEBUG",
    "SECRET_KEY",
    "ALLOWED_HOSTS",
    "CSRF_TRUSTED_ORIGINS",
    "DATABASE_URL",
    "SECURE_PROXY_SSL_HEADER",
    "FORWARDED_ALLOW_IPS",
    "STATIC_ROOT",
    "MEDIA_ROOT",
    "RUNS_METRICS_TOKEN",
    "RUNS_RETENTION_DAYS",
    "RUNS_LISTEN",
    "RUNS_DB_PREPARE",
    "LLM_BASE_URL",
    "LLM_API_KEY",
    "LLM_MODEL",
    "AGENT_MODULES",
    "RUNS_LOG_FORMAT",
}
# What a process on a bare host has besides the env file (the test session's settings are not among them).
HOST_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ")


# --- reading the files ------------------------------------------------------------


def documented_environment() -> dict[str, str]:
    """The variables of deploy/agentruns.env.example, each with its one comment line above it."""
    variables: dict[str, str] = {}
    commented = False
    for number, line in enumerate(ENV_EXAMPLE.read_text().splitlines(), 1):
        if not line.strip():
            commented = False
        elif line.startswith("#"):
            commented = True
        else:
            name, equals, value = line.partition("=")
            assert equals and re.fullmatch(r"[A-Z][A-Z0-9_]*", name), (
                f"line {number} is not KEY=value: {line!r}"
            )
            assert commented, f"line {number}: {name} has no comment line above it"
            # systemd keeps "x # y" as the value: a comment must be a line of its own.
            assert " #" not in value, f"line {number}: a comment after the value becomes part of it"
            assert name not in variables, f"line {number}: {name} twice"
            variables[name] = value
            commented = False
    return variables


def production_environment(**overrides: str) -> dict[str, str]:
    """A bare host's variables plus exactly the env file, with the test database and real random secrets."""
    env = {name: os.environ[name] for name in HOST_VARIABLES if name in os.environ}
    env |= documented_environment()
    # The file's placeholder secrets refuse to start (tests/config/test_secrets.py): real random ones here.
    env |= {
        "DATABASE_URL": database_url(),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "RUNS_METRICS_TOKEN": secrets.token_urlsafe(32),
        "PYTHONUNBUFFERED": "1",
    }
    return env | overrides


def read_unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        delimiters=("=",), interpolation=None, strict=True, empty_lines_in_values=False
    )
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(path.read_text(), source=str(path))
    return parser


def unit_command(line: str) -> list[str]:
    """`<venv python> manage.py <command> <options>` of an Exec line → [command, *options]."""
    argv = shlex.split(line.replace("%I", WORKER_INSTANCE))
    assert not any("%" in arg for arg in argv), (
        f"a systemd specifier this test does not know: {line}"
    )
    python, manage, *command = argv
    assert python.startswith("/") and Path(python).name.startswith("python"), line
    assert manage == "manage.py", f"manage.py is found in WorkingDirectory: {line}"
    return command


def procfile() -> dict[str, list[str]]:
    """Process type → [command, *options] of each `name: python manage.py ...` line."""
    entries: dict[str, list[str]] = {}
    for line in (DEPLOY / "Procfile").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, colon, command = line.partition(":")
        assert colon and re.fullmatch(r"[a-z0-9_]+", name), line
        python, manage, *argv = shlex.split(command)
        assert (python, manage) == ("python", "manage.py"), line
        entries[name] = argv
    return entries


def seconds(span: str) -> float:
    """A systemd time span ("690", "90s", "11min 30s") in seconds."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts, span
    return sum(float(number) * units[unit] for number, unit in parts)


def parse_options(argv: list[str], where: str):
    """The options of `manage.py <command> ...`, parsed by the command's own parser."""
    name, *args = argv
    commands = get_commands()
    assert name in commands, f"{where}: there is no management command {name!r}"
    parser = load_command_class(commands[name], name).create_parser("manage.py", name)
    try:
        return parser.parse_args(args)
    except CommandError as exc:
        pytest.fail(f"{where}: manage.py {name} does not accept {args}: {exc}")


def stop_timeouts() -> dict[str, float]:
    """TimeoutStopSec of the unit that runs each management command (serve, runworker, ...)."""
    services = [read_unit(path)["Service"] for path in UNITS]
    return {unit_command(s["ExecStart"])[0]: seconds(s["TimeoutStopSec"]) for s in services}


# --- the environment --------------------------------------------------------------


def test_the_env_file_documents_the_production_environment_one_comment_line_each():
    assert set(documented_environment()) >= DOCUMENTED
    assert documented_environment()["DEBUG"] == "0"


def test_check_deploy_is_silent_with_exactly_the_documented_production_environment(db):
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy", "--fail-level", "DEBUG"],
        cwd=ROOT,
        env=production_environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert (result.stdout + result.stderr).strip() in (
        "",
        "System check identified no issues (0 silenced).",
    )


# --- the units --------------------------------------------------------------------


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_each_unit_runs_a_management_command_with_options_it_accepts(path):
    service = read_unit(path)["Service"]

    for key in ("ExecStartPre", "ExecStart"):
        parse_options(unit_command(service[key]), f"{path.name} {key}")
    assert unit_command(service["ExecStartPre"]) == ["migrate", "--check"]  # checks, never migrates


def test_the_worker_template_takes_its_queues_from_the_instance_name():
    command = unit_command(read_unit(DEPLOY / "agentruns-worker@.service")["Service"]["ExecStart"])

    assert command[0] == "runworker"
    assert parse_options(command, "agentruns-worker@.service").queues == ["default", "short"]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_each_unit_runs_sandboxed_as_its_own_user_and_stops_on_sigterm(path):
    unit = read_unit(path)
    service = unit["Service"]

    assert service["User"] == service["Group"] == "agentruns"
    assert service["WorkingDirectory"].startswith("/") and service["EnvironmentFile"].startswith(
        "/"
    )
    assert (service["Restart"], service["KillSignal"], service["KillMode"]) == (
        "on-failure",
        "SIGTERM",
        "mixed",
    )
    assert (service["NoNewPrivileges"], service["ProtectSystem"], service["PrivateTmp"]) == (
        "yes",
        "strict",
        "yes",
    )
    assert set(unit["Unit"]["After"].split()) >= {"network-online.target", "postgresql.service"}
    assert "network-online.target" in unit["Unit"]["Wants"].split()
    assert unit["Unit"]["PartOf"] == unit["Install"]["WantedBy"] == "agentruns.target"


def test_the_processes_that_write_may_write_media_root():
    media_root = documented_environment()["MEDIA_ROOT"]
    for name in ("agentruns-web.service", "agentruns-worker@.service", "agentruns-reaper.service"):
        assert read_unit(DEPLOY / name)["Service"]["ReadWritePaths"].split() == [media_root], name


def test_stop_timeouts_outlast_each_process_s_own_shutdown():
    timeouts = stop_timeouts()
    web = parse_options(
        unit_command(read_unit(DEPLOY / "agentruns-web.service")["Service"]["ExecStart"]), "web"
    )

    # A worker lets each in-flight step run to its end or its timeout, then releases the run (an exit
    # that retries while the database is away): a SIGKILL before that repeats the step.
    assert timeouts["runworker"] > settings.RUNS_STEP_TIMEOUT_SECONDS + EXIT_RETRY_SECONDS
    assert timeouts["serve"] > web.graceful
    assert (
        timeouts["deliverwebhooks"] >= DeliveryLoop().lease
    )  # a send cut short goes again after its lease
    assert set(timeouts) == {"serve", "runworker", "reap", "deliverwebhooks"}


def test_the_target_enables_the_singletons_and_every_unit_is_part_of_it():
    target = read_unit(DEPLOY / "agentruns.target")

    assert set(target["Install"]["Also"].split()) == {
        p.name for p in UNITS if not p.name.endswith("@.service")
    }
    assert target["Install"]["WantedBy"] == "multi-user.target"


@pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)
def test_systemd_analyze_verify_finds_nothing_wrong(tmp_path):
    # verify checks that the executables exist: point the venv's python at this one.
    venv_python = shlex.split(read_unit(UNITS[0])["Service"]["ExecStart"])[0]
    for path in [*UNITS, DEPLOY / "agentruns.target"]:
        (tmp_path / path.name).write_text(path.read_text().replace(venv_python, sys.executable))
    instance = tmp_path / "agentruns-worker@default\\x2cshort.service"
    shutil.copy(tmp_path / "agentruns-worker@.service", instance)

    result = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.iterdir())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    complaints = [
        line for line in (result.stdout + result.stderr).splitlines() if "agentruns" in line
    ]
    assert result.returncode == 0 and complaints == [], result.stdout + result.stderr


# --- the Procfile -----------------------------------------------------------------


def test_the_procfile_runs_real_commands_on_known_queues():
    entries = procfile()

    assert {"release", "web", "worker_short", "worker_long", "reaper", "webhooks"} <= set(entries)
    assert entries["release"] == ["migrate"]  # once per deploy, before the new processes start
    for name, argv in entries.items():
        options = parse_options([arg.replace("$PORT", "5000") for arg in argv], f"Procfile {name}")
        if argv[0] == "runworker":
            assert set(options.queues) <= set(settings.RUNS_QUEUES), name


@pytest.mark.django_db(transaction=True)
def test_the_procfile_processes_run_a_run_per_queue_over_http_and_stop_by_themselves(
    processes, api_key, tmp_path
):
    port = free_port()
    # The documented production environment; this test is the TLS-terminating proxy on loopback
    # (FORWARDED_ALLOW_IPS=127.0.0.1): it sends the public Host and X-Forwarded-Proto: https.
    env = production_environment(
        AGENT_MODULES=os.environ["AGENT_MODULES"],  # the test kinds
        STATIC_ROOT=str(tmp_path / "static"),
        MEDIA_ROOT=str(tmp_path / "media"),
        LLM_BASE_URL="",
        RUNS_WEBHOOKS_ALLOW_PRIVATE="1",
        PORT=str(port),
    )
    (tmp_path / "static").mkdir()  # as collectstatic would have made it
    proxy = {
        "Host": documented_environment()["ALLOWED_HOSTS"].split(",")[0],
        "X-Forwarded-Proto": "https",
    }
    base = f"http://127.0.0.1:{port}"
    entries = procfile()

    def argv(name: str) -> list[str]:
        return [
            sys.executable,
            str(ROOT / "manage.py"),
            *(arg.replace("$PORT", str(port)) for arg in entries[name]),
        ]

    release = subprocess.run(
        argv("release"), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert release.returncode == 0, release.stdout + release.stderr

    started: dict[str, subprocess.Popen] = {}
    for name in entries.keys() - {"release"}:
        log = open(tmp_path / f"{name}.log", "wb")
        proc = subprocess.Popen(argv(name), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        proc.log_path = log.name  # type: ignore[attr-defined]
        processes.procs.append(proc)  # SIGKILLed at teardown if still alive
        started[name] = proc

    def output(name: str) -> str:
        return processes.output(started[name])

    def web_is_up() -> bool:
        assert started["web"].poll() is None, output("web")
        try:
            return httpx.get(base + "/api/health", headers=proxy, timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(web_is_up, timeout=90, what="the web process to answer")
    receiver = Receiver()
    try:
        client = httpx.Client(
            base_url=base, headers=proxy | {"Authorization": f"Bearer {api_key}"}, timeout=10
        )
        queues = sorted(
            {
                q
                for name, a in entries.items()
                if a[0] == "runworker"
                for q in parse_options(a, name).queues
            }
        )
        ids = {}
        for queue in queues:
            answer = client.post(
                "/api/runs",
                json={
                    "kind": "echo",
                    "input": {"text": queue},
                    "queue": queue,
                    "callback_url": receiver.url,
                },
            )
            assert answer.status_code == 202, answer.text
            ids[queue] = answer.json()["id"]

        def finished() -> bool:
            statuses = {
                queue: client.get(f"/api/runs/{i}").json()["status"] for queue, i in ids.items()
            }
            assert not set(statuses.values()) & {"failed", "cancelled"}, statuses
            return set(statuses.values()) == {"done"}

        wait_until(finished, timeout=90, what=f"a run on each of {queues} to finish")
        for queue, run_id in ids.items():
            assert client.get(f"/api/runs/{run_id}").json()["result"] == {"echo": queue}
        deliveries = receiver.wait_for(len(ids), timeout=60)  # sent by the webhooks process
        assert sorted(json.loads(d.body)["data"]["run_id"] for d in deliveries) == sorted(
            ids.values()
        )
    finally:
        receiver.stop()

    timeouts = stop_timeouts()
    signalled = time.monotonic()
    for proc in started.values():
        proc.send_signal(signal.SIGTERM)
    for name, proc in started.items():
        limit = timeouts[entries[name][0]]
        try:
            proc.wait(max(0.1, signalled + limit - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(
                f"{name} did not stop within its unit's TimeoutStopSec ({limit:g} s):\n{output(name)}"
            )
        assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{output(name)}"
        if name == "web":  # both of its processes stopped gracefully
            assert output(name).count("Finished server process") == 2, output(name)
