"""runs/queries.py: every statement by name, whole, checked when it is loaded."""

import re

import pytest
from django.db import connection

from runs.queries import Queries, StatementError, one, queries, rows


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path


def test_a_statement_is_its_text_with_the_literals_and_fragments_filled_and_its_comments_dropped(
    tmp_path,
):
    write(
        tmp_path,
        "a.sql",
        "-- the file's own comment\n\n"
        "-- fragment: ready\nstatus = {queued}\n\n"
        "-- name: count_ready\n-- why it is written so\nSELECT count(*) AS n FROM runs_run WHERE {ready}\n",
    )
    loaded = Queries(tmp_path)
    assert loaded.names() == ["count_ready"]
    assert loaded.count_ready == "SELECT count(*) AS n FROM runs_run WHERE status = 'queued'"


def test_a_name_declared_twice_is_refused_with_both_files(tmp_path):
    write(tmp_path, "a.sql", "-- name: same\nSELECT 1\n")
    write(tmp_path, "b.sql", "-- name: same\nSELECT 2\n")
    with pytest.raises(StatementError, match=r"same is declared in a.sql and again in b.sql"):
        Queries(tmp_path)


def test_a_placeholder_nothing_fills_is_refused_at_load_naming_the_statement(tmp_path):
    write(tmp_path, "a.sql", "-- name: broken\nSELECT 1 WHERE {no_such_fragment}\n")
    with pytest.raises(
        StatementError,
        match=r"a.sql: broken: no status literal or fragment is named 'no_such_fragment'",
    ):
        Queries(tmp_path)


def test_text_before_the_first_header_is_refused(tmp_path):
    write(tmp_path, "a.sql", "SELECT 1\n-- name: late\nSELECT 2\n")
    with pytest.raises(StatementError, match=r"a.sql:1"):
        Queries(tmp_path)


def test_an_unknown_name_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="no statement named 'wake_every_run'"):
        queries.wake_every_run  # noqa: B018


def _numbered(text):
    """The statement with its %(name)s placeholders as $1, $2... for PREPARE."""
    numbers: dict[str, int] = {}

    def number(match):
        return f"${numbers.setdefault(match.group(1), len(numbers) + 1)}"

    return re.sub(r"%\((\w+)\)s", number, text).replace("%%", "%")


@pytest.mark.django_db
@pytest.mark.parametrize("name", queries.names())
def test_postgresql_parses_and_plans_every_statement(name):
    # A typo, a column that is gone or a placeholder of unknown type fails
    # here, not in the first run that reaches the statement.
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE checked AS {_numbered(getattr(queries, name))}")
        cursor.execute("DEALLOCATE checked")


@pytest.mark.django_db
def test_rows_are_read_by_column_name():
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 AS one, 'two' AS two UNION ALL SELECT 3, 'four'")
        assert rows(cursor) == [{"one": 1, "two": "two"}, {"one": 3, "two": "four"}]
        cursor.execute("SELECT 1 AS one WHERE false")
        assert one(cursor) is None
