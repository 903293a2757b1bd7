"""Placeholder and weak secrets refuse to start with DEBUG off (issue 25, finding 8).

A known SECRET_KEY forges sessions and stream tokens, and the example env
file's values are public: `manage.py check --deploy` with the file as shipped
must refuse, naming the placeholder; with real random values it is silent.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.conftest import test_database_url as database_url
from tests.deploy.test_files import HOST_VARIABLES, documented_environment


def check_deploy(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check", "--deploy"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def shipped(**overrides: str) -> dict[str, str]:
    """A bare host's variables plus the env file exactly as shipped (the test database to reach)."""
    env = {name: os.environ[name] for name in HOST_VARIABLES if name in os.environ}
    return (
        env
        | documented_environment()
        | {"DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
        | overrides
    )


def test_check_deploy_refuses_the_example_env_file_as_shipped_naming_its_placeholder(db):
    result = check_deploy(shipped())

    assert result.returncode != 0
    assert "SECRET_KEY is still the placeholder of the example env file" in result.stderr
    assert "token_urlsafe(50)" in result.stderr  # it says what to do


def test_check_deploy_refuses_the_shipped_metrics_token_once_the_key_is_real(db):
    result = check_deploy(shipped(SECRET_KEY=secrets.token_urlsafe(50)))

    assert result.returncode != 0
    assert "RUNS_METRICS_TOKEN is still the placeholder of the example env file" in result.stderr


@pytest.mark.parametrize("key", ["x" * 60, "abcd" * 20, secrets.token_urlsafe(20)])
def test_short_or_simple_keys_refuse_to_start(db, key):
    result = check_deploy(shipped(SECRET_KEY=key, RUNS_METRICS_TOKEN=secrets.token_urlsafe(32)))

    assert result.returncode != 0
    assert "SECRET_KEY is too short or too simple" in result.stderr


def test_a_short_metrics_token_refuses_to_start(db):
    result = check_deploy(
        shipped(SECRET_KEY=secrets.token_urlsafe(50), RUNS_METRICS_TOKEN="s3cret")
    )

    assert result.returncode != 0
    assert "RUNS_METRICS_TOKEN is too short (6 characters)" in result.stderr


def test_check_deploy_is_silent_with_real_random_values(db):
    env = shipped(
        SECRET_KEY=secrets.token_urlsafe(50),
        RUNS_METRICS_TOKEN=secrets.token_urlsafe(32),
        DEBUG="0",
        ALLOWED_HOSTS="runs.example.com",
    )

    result = check_deploy(env)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


def test_the_test_session_key_passes():
    result = subprocess.run(
        [sys.executable, "-c", "import config.testdb, config.settings"],
        cwd=ROOT,
        env=os.environ | {"DEBUG": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
