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


def test_the_submits_insert_names_every_column_of_a_run():
    # A field added to Run must be added to insert_queued_run too, or a
    # submit would leave it to a default the database does not have.
    from runs.models import Run

    text = queries.insert_queued_run
    listed = re.search(r"INSERT INTO runs_run \((.*?)\) VALUES", text, re.S).group(1)
    columns = [c.strip() for c in listed.split(",")]
    fields = [f for f in Run._meta.local_concrete_fields if not f.generated]
    assert sorted(columns) == sorted(f.column for f in fields)
    for column in columns:
        assert f"%({column})s" in text, column
    # The one db_default, filled by the statement when a submit leaves it out.
    assert [f.column for f in fields if f.has_db_default()] == ["run_after"]
    assert "COALESCE(%(run_after)s, statement_timestamp())" in text


def test_the_webhook_fragments_say_what_the_models_say():
    from runs.models import RECEIVER_SQL
    from runs.models.notifications import LIVE_DELIVERY_STATUSES

    assert queries.fragment("receiver_of_d") == RECEIVER_SQL.format(url="d.url")
    assert (
        queries.fragment("live_deliveries")
        == "(" + ", ".join(f"'{s}'" for s in LIVE_DELIVERY_STATUSES) + ")"
    )
