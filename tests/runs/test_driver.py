"""runs/driver.py: psycopg's private names behind one version check, and an engine cursor either way."""

from __future__ import annotations

import ast
import importlib
import logging
import re
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import driver
from runs.driver import engine_cursor, psycopg_version, raise_cache_limits
from runs.engine import claim as claims
from runs.models import Run
from runs.queries import one, queries
from runs.services import submit_run

ROOT = Path(__file__).resolve().parents[2]
INSTALLED = psycopg_version()
UNSUPPORTED = (4, 0, 0)

psycopg_queries = importlib.import_module("psycopg._queries")


@pytest.fixture
def default_limits(monkeypatch):
    """psycopg's own limits, as a process whose version is not supported keeps them; restored after."""
    monkeypatch.setattr(psycopg_queries, "MAX_CACHED_STATEMENT_LENGTH", 4096)
    monkeypatch.setattr(psycopg_queries, "MAX_CACHED_STATEMENT_PARAMS", 50)
    monkeypatch.setattr(driver, "_warned", False)


def test_versions_are_read_as_numbers_up_to_a_suffix():
    assert psycopg_version("3.3.9") == (3, 3, 9)
    assert psycopg_version("3.4.0.dev1") == (3, 4, 0)
    assert psycopg_version("3.2.1rc2") == (3, 2, 1)


def test_the_installed_psycopg_is_one_whose_cache_limits_are_known():
    # Upgrading psycopg past the known range should be a decision: this says when.
    assert driver.cache_limits_known(INSTALLED), (
        f"psycopg {psycopg.__version__}: check psycopg/_queries.py and extend CACHE_LIMITS_KNOWN"
    )


def test_a_known_version_lets_the_engines_long_statements_be_cached(default_limits):
    assert raise_cache_limits(INSTALLED) is True
    assert psycopg_queries.MAX_CACHED_STATEMENT_LENGTH >= len(queries.claim)
    assert psycopg_queries.MAX_CACHED_STATEMENT_PARAMS >= 51  # a submit's insert has one per column


def test_an_unknown_version_touches_nothing_private_and_warns_once(default_limits, caplog):
    with caplog.at_level(logging.WARNING, logger="runs.driver"):
        assert raise_cache_limits(UNSUPPORTED) is False
        assert raise_cache_limits(UNSUPPORTED) is False
    assert psycopg_queries.MAX_CACHED_STATEMENT_LENGTH == 4096
    assert psycopg_queries.MAX_CACHED_STATEMENT_PARAMS == 50
    warnings = [r for r in caplog.records if r.name == "runs.driver"]
    assert len(warnings) == 1
    assert "psycopg 4.0.0" in warnings[0].getMessage()


@pytest.mark.django_db
@pytest.mark.parametrize("version", [INSTALLED, UNSUPPORTED], ids=["known", "unknown"])
def test_either_way_the_engine_cursor_binds_on_the_server_and_claims(
    version, default_limits, tenant
):
    raise_cache_limits(version)
    with engine_cursor() as cursor:
        # Server-side binding: psycopg's own Cursor, not Django's ClientCursor.
        assert type(cursor.cursor) is psycopg.Cursor
        cursor.execute("SELECT %(n)s::int + 1 AS m", {"n": 1})
        assert one(cursor) == {"m": 2}
    run = submit_run(tenant=tenant, kind="noop3", input={})
    # The claim, longer than psycopg's default cache limit, through the same cursor.
    [claimed] = claims.claim(
        worker_id=uuid4(), queues=["default"], kinds={"noop3": 1}, n=1, lease=60
    )
    assert claimed.id == run.id
    assert Run.objects.get(pk=run.pk).status == "running"


@pytest.mark.django_db
def test_the_engine_cursors_statements_are_in_djangos_query_log():
    with CaptureQueriesContext(connection) as captured, engine_cursor() as cursor:
        cursor.execute("SELECT 41 + %(n)s::int AS answer", {"n": 1})
        assert one(cursor) == {"answer": 42}
    [logged] = captured.captured_queries
    assert logged["sql"].startswith("SELECT 41 + ")


@pytest.mark.django_db
def test_the_engine_cursor_gives_rows_by_column_name():
    with engine_cursor() as cursor:
        cursor.execute("SELECT 1 AS a, 'x' AS \"café\" UNION ALL SELECT 2, 'y'")
        assert cursor.fetchall() == [{"a": 1, "café": "x"}, {"a": 2, "café": "y"}]
        cursor.execute("SELECT 1 AS a WHERE false")
        assert one(cursor) is None
        # A statement that returns no rows, then one that does, on the same cursor.
        cursor.execute("SET LOCAL statement_timeout = '5s'")
        cursor.execute("SELECT %(n)s::int AS n", {"n": 7})
        assert one(cursor) == {"n": 7}


# A private name of psycopg's (a module or attribute whose name starts with
# one underscore), or Django's private way of wrapping a cursor.
_PRIVATE_TEXT = re.compile(r"psycopg(?:_pool)?\._[a-z]|_prepare_cursor")


def _private_uses(path: Path) -> list[str]:
    source = path.read_text()
    found = [f"{path}: {m.group()}" for m in _PRIVATE_TEXT.finditer(source)]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in (
            "psycopg",
            "psycopg_pool",
        ):
            names = (node.module or "").split(".")[1:] + [alias.name for alias in node.names]
            found += [f"{path}:{node.lineno}: {name}" for name in names if _private(name)]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] in ("psycopg", "psycopg_pool") and any(map(_private, parts[1:])):
                    found.append(f"{path}:{node.lineno}: {alias.name}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_but_runs_driver_names_a_private_psycopg_name():
    offenders = [
        use
        for folder in ("runs", "workers", "config")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path != ROOT / "runs" / "driver.py"
        for use in _private_uses(path)
    ]
    assert offenders == []


def test_the_check_finds_each_way_of_naming_one(tmp_path):
    for source in (
        "from psycopg import _queries\n",
        "import psycopg._queries\n",
        "from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH\n",
        "import psycopg\npsycopg._queries.MAX_CACHED_STATEMENT_LENGTH = 1\n",
        "def f(connection, raw):\n    return connection._prepare_cursor(raw)\n",
    ):
        path = tmp_path / "offender.py"
        path.write_text(source)
        assert _private_uses(path), source
