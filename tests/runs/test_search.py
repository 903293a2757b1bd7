"""Run titles (made at submit) and searching runs by title and input text (list_runs(search=), GET /api/runs?q=)."""

from __future__ import annotations

import logging
from urllib.parse import quote

import pytest
from django.db import connection

import tests.support.agents_outcome  # noqa: F401  (registers the kinds in this process)
from runs import selectors
from runs.exceptions import InvalidRunInput
from runs.models import Run
from runs.services import submit_run
from runs.titles import one_line
from tests.support.factories import TenantFactory
from tests.support.fake_openai import drive


def submit(tenant, kind="silent", **data) -> Run:
    return submit_run(tenant=tenant, kind=kind, input=data)


def found(tenant, search, **filters) -> list[Run]:
    return selectors.list_runs(tenant=tenant, search=search, **filters).items


def ids(runs) -> list:
    return [run.id for run in runs]


# --- Titles ------------------------------------------------------------------------


@pytest.mark.django_db
class TestTitles:
    def test_by_default_the_first_string_field_names_the_run(self, tenant):
        assert submit(tenant, count=3, customer="  Acme\n Corp ", note="x").title == "Acme Corp"
        assert submit(tenant, questions=["Who?", "Why?", "When?"]).title == "Who? (+2 more)"
        assert submit(tenant, count=3).title == ""

    def test_a_kind_names_its_runs_with_a_function_or_a_field(self, tenant):
        assert (
            submit(tenant, "titled_by_function", order=7, customer="Acme").title
            == "Order 7 for Acme"
        )
        assert submit(tenant, "titled_by_field", note="first", customer="Globex").title == "Globex"
        # A blank or missing field: the default title.
        assert submit(tenant, "titled_by_field", note="first", customer=" ").title == "first"

    def test_a_title_function_that_raises_does_not_lose_the_run(self, tenant, caplog):
        with caplog.at_level(logging.ERROR, logger="runs.titles"):
            run = submit(tenant, "title_raises", customer="Initech")
        assert (run.status, run.title) == ("queued", "Initech")
        assert Run.objects.filter(pk=run.pk).exists()
        assert "title_raises" in caplog.text and "KeyError" in caplog.text

    def test_a_title_function_that_returns_no_text_falls_back(self, tenant):
        assert submit(tenant, "title_not_text", customer="Umbrella").title == "Umbrella"

    def test_titles_are_one_bounded_line(self, tenant):
        run = submit(tenant, customer="Line one\nline two\t\x07 \u202eflipped " + "y" * 500)
        assert run.title.startswith("Line one line two flipped yyy")
        assert len(run.title) == 200 and run.title.endswith("…")
        assert one_line("\x00\x01 a \ud800 b \r\n", limit=10) == "a b"

    def test_the_migration_titles_existing_runs(self, tenant, monkeypatch):
        import importlib

        from django.apps import apps

        migration = importlib.import_module("runs.migrations.0015_run_outcome_summary_title_search")
        monkeypatch.setattr(migration, "BACKFILL_BATCH", 2)  # in batches, one of them not full
        known = submit(tenant, "titled_by_function", order=3, customer="Acme")
        default = submit(tenant, count=1, customer="Globex")
        unknown = submit(tenant, customer="Initech")
        Run.objects.filter(pk=unknown.pk).update(kind="retired_kind")
        Run.objects.update(title="")
        with connection.schema_editor() as editor:
            migration.backfill_titles(apps, editor)
        titles = dict(Run.objects.values_list("id", "title"))
        assert titles == {known.id: "Order 3 for Acme", default.id: "Globex", unknown.id: "Initech"}

    def test_a_kind_cannot_declare_a_title_of_another_type(self):
        from runs.registry import agent

        with pytest.raises(TypeError, match="title must be"):
            agent("bad_title", title=3)


@pytest.mark.django_db(transaction=True)
def test_children_get_titles_through_the_same_submit(tenant):
    parent = submit(tenant, "spawns_titled", order=12)
    [parent] = drive(parent)
    [child] = Run.objects.filter(parent=parent)
    assert (parent.status, child.title) == ("done", "Order 12 for Child Corp")


# --- Search ------------------------------------------------------------------------


@pytest.fixture(params=[selectors.SEARCH_WINDOW, 2], ids=["newest-window", "past-the-window"])
def window(request, monkeypatch):
    """Each search test twice: found among the newest runs, and (a window of 2) mostly in older ones."""
    monkeypatch.setattr(selectors, "SEARCH_WINDOW", request.param)
    return request.param


@pytest.mark.django_db
@pytest.mark.usefixtures("window")
class TestSearch:
    def test_matches_the_title_and_the_inputs_text_case_insensitively(self, tenant):
        titled = submit(tenant, "titled_by_function", order=1, customer="Wayne Enterprises")
        nested = submit(
            tenant,
            customer="Stark",
            notes={"history": ["met at the expo", "Renewal CONTRACT signed"]},
        )
        other = submit(tenant, customer="Oscorp", notes={"history": ["nothing yet"]})
        assert ids(found(tenant, "order 1 for")) == [titled.id]  # words of the title
        assert ids(found(tenant, "wayne")) == [titled.id]
        assert ids(found(tenant, "contract renewal")) == [
            nested.id
        ]  # every word, in any order, at any depth
        assert ids(found(tenant, "Contract oscorp")) == []
        assert ids(found(tenant, "ORP")) == [other.id]  # part of a word
        assert set(ids(found(tenant, "  "))) == {titled.id, nested.id, other.id}  # blank: no search

    def test_keys_and_numbers_of_the_input_are_not_its_text(self, tenant):
        submit(tenant, customer="Hooli", history=["called"], invoice=31337)
        assert found(tenant, "history") == []
        assert found(tenant, "31337") == []
        assert len(found(tenant, "hooli called")) == 1

    def test_only_the_tenants_runs_are_found(self, tenant):
        other = TenantFactory()
        mine = submit(tenant, customer="Acme Widgets")
        submit(other, customer="Acme Widgets")
        assert ids(found(tenant, "widgets")) == [mine.id]

    def test_results_come_newest_first_in_keyset_pages_with_the_other_filters(self, tenant):
        matching = []
        for n in range(7):
            matching.append(submit(tenant, customer=f"Pied Piper {n}"))
            submit(tenant, customer="Raviga")
            submit(tenant, "titled_by_field", customer="Pied Piper other kind")
        seen, cursor = [], None
        while True:
            page = selectors.list_runs(
                tenant=tenant, search="piper", kind="silent", limit=3, cursor=cursor
            )
            seen += ids(page.items)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == ids(reversed(matching))

    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("100%", ["Discount 100% off"]),
            ("row_id", ["key row_id"]),
            ("C:\\temp", ["path C:\\temp\\x"]),
            ('say "hi"', ['they say "hi" twice']),
        ],
    )
    def test_like_characters_quotes_and_backslashes_match_literally(self, tenant, text, expected):
        for customer in [
            "Discount 100% off",
            "Discount 1000 off",
            "key row_id",
            "key rowxid",
            "path C:\\temp\\x",
            "path C:temp",
            'they say "hi" twice',
            "they say hi twice",
        ]:
            submit(tenant, customer=customer)
            submit(tenant, "titled_by_function", order=0, customer=customer)  # in the title too
        runs = found(tenant, text)
        assert sorted({run.input["customer"] for run in runs}) == expected
        assert len(runs) == 2  # the input's text and the title

    def test_control_characters_in_a_search_are_spaces(self, tenant):
        run = submit(tenant, customer="Vandelay Industries")
        assert ids(found(tenant, "vandelay\x00industries\n")) == [run.id]

    @pytest.mark.parametrize(
        ("text", "detail"),
        [
            ("ab", "at least 3 letters or digits"),
            ("%%%", "at least 3 letters or digits"),
            ("a b c d", "at least 3 letters or digits"),
            ("x" * 10_000, "at most 200 characters"),
            ("one two three four five six seven eight nine", "at most 8 words"),
        ],
    )
    def test_a_search_no_index_can_serve_is_refused_readably(self, tenant, text, detail):
        with pytest.raises(InvalidRunInput, match=detail):
            found(tenant, text)

    def test_short_words_narrow_a_longer_one(self, tenant):
        submit(tenant, customer="Acme Co")
        wanted = submit(tenant, customer="Acme Ltd")
        assert ids(found(tenant, "acme lt")) == [wanted.id]

    def test_the_query_can_use_the_search_index(self, tenant):
        submit(tenant, customer="Initrode")
        # Without the tenant's filter, whose index would serve a handful of rows too.
        query = Run.objects.matching(["initrode"], tenant=tenant).newest_first()[:50]
        compiled, params = query.query.sql_with_params()
        with connection.cursor() as cursor:
            # On a handful of rows a scan would win: forbid it, to see that the index matches the query.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_indexscan = off")
            cursor.execute("EXPLAIN " + compiled, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert "run_search_keys_idx" in plan, plan


# --- The API -----------------------------------------------------------------------


def assert_error(response, status: int, detail: str) -> None:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    assert detail in response.json()["detail"]


@pytest.mark.django_db
class TestApiSearch:
    def test_q_finds_runs_and_pages_them(self, api, tenant):
        runs = [submit(tenant, customer=f"Soylent order {n}") for n in range(3)]
        submit(tenant, customer="Tyrell")
        body = api.get("/api/runs?q=SOYLENT&limit=2").json()
        assert [item["id"] for item in body["items"]] == [str(runs[2].id), str(runs[1].id)]
        assert body["items"][0]["title"] == "Soylent order 2"
        rest = api.get(f"/api/runs?q=SOYLENT&limit=2&cursor={body['next_cursor']}").json()
        assert [item["id"] for item in rest["items"]] == [str(runs[0].id)] and rest[
            "next_cursor"
        ] is None

    def test_another_tenants_runs_are_not_found(self, api, tenant):
        submit(TenantFactory(), customer="Cyberdyne")
        assert api.get("/api/runs?q=cyberdyne").json()["items"] == []

    @pytest.mark.parametrize(
        ("raw", "status", "detail"),
        [
            ("%00abc", 422, "NUL"),
            ("ab", 422, "at least 3 letters or digits"),
            ("%25%25", 422, "at least 3 letters or digits"),
            ("x" * 10_000, 422, "at most 200 characters"),
        ],
    )
    def test_hostile_search_text_is_a_clear_4xx(self, api, tenant, raw, status, detail):
        assert_error(api.get(f"/api/runs?q={raw}"), status, detail)

    @pytest.mark.parametrize(
        "raw",
        [
            "%ED%A0%80abc",  # a lone surrogate, UTF-8 encoded: not UTF-8, decoded as replacement characters
            "abc%FF%FE",  # not UTF-8 either
            "100%25_%5C",  # LIKE's characters and its escape, literally
            quote("dynamic \udc80", errors="surrogatepass"),
        ],
    )
    def test_odd_search_text_matches_literally_and_never_fails(self, api, tenant, raw):
        submit(tenant, customer="Massive Dynamic 1000")
        response = api.get(f"/api/runs?q={raw}")
        assert response.status_code == 200, response.content
        assert response.json()["items"] == []

    def test_punctuation_only_is_refused(self, api, tenant):
        assert_error(api.get("/api/runs?q=%5C%5C%25_"), 422, "at least 3 letters or digits")
