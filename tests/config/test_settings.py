"""Settings for production: no development key with DEBUG off, HTTPS by default, `check --deploy` clean.

Each case starts a fresh process (settings are read once, at startup) with
the environment README.md's deploy section documents, without the test
session's own key and plain-HTTP switches (config/testdb.py).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import textwrap
from urllib.parse import urlsplit, urlunsplit

import pytest

from config.settings import DEVELOPMENT_SECRET_KEY
from tests.conftest import ROOT, free_port
from tests.conftest import test_database_url as database_url

# What the test session sets for itself; a production process has none of it.
SESSION_ONLY = (
    "DEBUG",
    "SECRET_KEY",
    "SECURE_SSL_REDIRECT",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    "SECURE_HSTS_PRELOAD",
    "SECURE_PROXY_SSL_HEADER",
    "RUNS_API_DOCS",
    "RUNS_EXAMPLES",
)


@pytest.fixture
def production(db) -> dict[str, str]:
    """The production environment of README.md's deploy section."""
    env = {name: value for name, value in os.environ.items() if name not in SESSION_ONLY}
    env.update(
        DEBUG="0",
        SECRET_KEY=secrets.token_urlsafe(50),
        ALLOWED_HOSTS="runs.example.com",
        DATABASE_URL=database_url(),
        PYTHONUNBUFFERED="1",
    )
    return env


def manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def python(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    """``code`` after django.setup(), in a process of its own with ``env``."""
    setup = "import django, os\nos.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings')\ndjango.setup()\n"
    return subprocess.run(
        [sys.executable, "-c", setup + textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_deploy_has_nothing_to_say_about_the_documented_production_environment(production):
    result = manage(production, "check", "--deploy", "--fail-level", "WARNING")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout
    assert "WARNINGS" not in result.stdout + result.stderr


@pytest.mark.parametrize("key", [None, "", DEVELOPMENT_SECRET_KEY])
def test_with_debug_off_the_project_refuses_to_start_without_a_secret_key_of_its_own(
    production, key
):
    env = {k: v for k, v in production.items() if k != "SECRET_KEY"}
    if key is not None:
        env["SECRET_KEY"] = key

    result = manage(env, "check")

    assert result.returncode != 0
    assert "ImproperlyConfigured: SECRET_KEY is not set" in result.stderr
    assert "set SECRET_KEY to 50 or more random characters" in result.stderr


def test_debug_on_uses_the_development_key(production):
    env = {k: v for k, v in production.items() if k != "SECRET_KEY"} | {"DEBUG": "1"}

    result = python(env, "from django.conf import settings; print(settings.SECRET_KEY)")

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == DEVELOPMENT_SECRET_KEY


def test_manage_py_up_turns_debug_on_so_make_run_needs_no_key(production):
    env = {k: v for k, v in production.items() if k not in ("SECRET_KEY", "DEBUG")}

    result = manage(env, "up", "--help")

    assert result.returncode == 0, result.stderr
    assert "Development in one command" in result.stdout


def test_production_serves_https_only_but_lets_the_health_check_through(production):
    result = python(
        production,
        """
        from django.test import Client
        client = Client(HTTP_HOST="runs.example.com")
        plain = client.get("/api/runs")
        print(plain.status_code, plain["Location"])
        print(client.get("/api/health").status_code)
        login = client.get("/accounts/login/", secure=True)
        print(login["Strict-Transport-Security"])
        print(login.cookies["csrftoken"]["secure"])
    """,
    )

    assert result.returncode == 0, result.stderr
    redirect, health, hsts, csrf_secure = result.stdout.splitlines()
    assert redirect == "301 https://runs.example.com/api/runs"
    assert health == "200"
    assert hsts == "max-age=31536000; includeSubDomains; preload"
    assert csrf_secure == "True"


def test_a_tls_terminating_proxy_is_trusted_only_when_configured(production):
    code = """
        from django.test import Client
        print(Client(HTTP_HOST="runs.example.com", HTTP_X_FORWARDED_PROTO="https").get("/api/health").status_code,
              Client(HTTP_HOST="runs.example.com", HTTP_X_FORWARDED_PROTO="https").get("/api/kinds").status_code)
    """
    assert python(production, code).stdout.split() == ["200", "301"]
    proxied = python(production | {"SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto"}, code)
    assert proxied.stdout.split() == ["200", "401"], proxied.stderr


@pytest.mark.parametrize("path", ["/api/docs", "/api/openapi.json"])
def test_runs_api_docs_0_turns_the_docs_and_the_schema_off(production, path):
    code = f"""
        from django.test import Client
        response = Client(HTTP_HOST="runs.example.com").get("{path}", secure=True)
        print(response.status_code, response["Content-Type"])
    """
    on = python(production, code)
    off = python(production | {"RUNS_API_DOCS": "0"}, code)

    assert on.stdout.split()[0] == "200", on.stderr
    assert off.stdout.split() == ["404", "application/json;", "charset=utf-8"], off.stderr


def test_a_database_url_with_several_hosts_connects_to_the_one_that_takes_writes(production):
    """libpq's several hosts (a primary and its standbys): the first one down, the next one is used."""
    parts = urlsplit(production["DATABASE_URL"])
    userinfo, at, host = parts.netloc.rpartition("@")
    down = f"127.0.0.1:{free_port()}"  # nothing listens there
    production["DATABASE_URL"] = urlunsplit(
        parts._replace(
            netloc=f"{userinfo}{at}{down},{host}", query="target_session_attrs=read-write"
        )
    )

    found = python(
        production,
        """
        from django.db import connection
        with connection.cursor() as cursor:
            cursor.execute("SELECT NOT pg_is_in_recovery()")
            print("WRITABLE", cursor.fetchone()[0], connection.settings_dict["HOST"].count(","))
        """,
    )

    assert found.returncode == 0, found.stderr[-3000:]
    assert "WRITABLE True 1" in found.stdout, found.stdout + found.stderr[-3000:]
