"""A tenant's search costs what its own runs make it cost (issue 25, finding 14).

Timing a search for a word must not tell a tenant how common that word is in
other tenants' runs. Tests cannot assert timings (bench/search_isolation.py
prints them): these assert the plan property behind them, on a few thousand
runs, with ``EXPLAIN (ANALYZE, BUFFERS)`` of the statement the search itself
sends. A word common only in another tenant reads the same pages as a word
that exists nowhere, and no row of the other tenant, index entry or heap row,
is ever looked at.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import tests.support.agents_outcome  # noqa: F401  (registers the kinds in this process)
from runs import selectors
from runs.models import Run
from runs.services import submit_run
from tests.support.factories import TenantFactory

OTHERS_RUNS = 3000
OWN_RUNS = 120
WINDOW = 20  # fewer than the tenant's runs: the search asks the index for the older ones


def add_runs(tenant, texts: list[str], *, start: int = 0) -> None:
    """Runs with these customers (the input's text, and the title), spread over the past, newest first."""
    now = timezone.now()
    Run.objects.bulk_create(
        Run(
            tenant=tenant,
            kind="silent",
            input={"customer": text},
            title=text,
            created_at=now - timedelta(seconds=start + n),
        )
        for n, text in enumerate(texts)
    )


def flush_search_index_pending_lists() -> None:
    """Move the GIN indexes' pending entries into their trees, as autovacuum soon does after a bulk insert.

    A scan reads the whole pending list, whatever it searches for: left
    there, the fresh rows would make every search read the same extra pages,
    hiding the difference the test looks for.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT gin_clean_pending_list(i.indexrelid) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_am am ON am.oid = c.relam WHERE i.indrelid = 'runs_run'::regclass AND am.amname = 'gin'"
        )
        cursor.execute("ANALYZE runs_run")


@pytest.fixture
def tenants(db, monkeypatch):
    """A small tenant, and another whose 3,000 runs all say "Kestrel" (a word the small one never uses)."""
    monkeypatch.setattr(selectors, "SEARCH_WINDOW", WINDOW)
    mine, other = TenantFactory(), TenantFactory()
    add_runs(mine, [f"Acme order {n}" for n in range(OWN_RUNS)])
    add_runs(other, [f"Kestrel Logistics order {n}" for n in range(OTHERS_RUNS)])
    flush_search_index_pending_lists()
    return mine, other


def explain_search(tenant, search: str) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement that reads the search index for list_runs (its last)."""
    with CaptureQueriesContext(connection) as captured:
        page = selectors.list_runs(tenant=tenant, search=search, without_payloads=True)
    assert page.items == []
    statement = captured.captured_queries[-1]["sql"]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement)
        [[result]] = cursor.fetchall()
    return (json.loads(result) if isinstance(result, str) else result)[0]["Plan"]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def pages_read(plan: dict) -> int:
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]


def rows_looked_at(plan: dict) -> int:
    """Rows any node of the plan returned or threw away: index entries found, heap rows rechecked or filtered."""
    return sum(
        node["Actual Rows"]
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
        for node in nodes(plan)
    )


def test_a_word_only_other_tenants_use_costs_what_a_word_nobody_uses_costs(tenants):
    mine, _ = tenants
    elsewhere = explain_search(mine, "kestrel")  # in every one of the other tenant's 3,000 runs
    nowhere = explain_search(
        mine, "qwxyzzy"
    )  # in no run at all: as many letters, as many index keys
    assert pages_read(elsewhere) == pages_read(nowhere), (elsewhere, nowhere)
    assert rows_looked_at(elsewhere) == 0, elsewhere
    assert "run_search_keys_idx" in json.dumps(elsewhere), (
        elsewhere
    )  # the index, not a scan of this tenant


def test_more_runs_with_the_word_in_another_tenant_change_nothing_here(tenants):
    mine, other = tenants
    before = explain_search(mine, "kestrel")
    add_runs(other, [f"Kestrel Foods order {n}" for n in range(OTHERS_RUNS)], start=OTHERS_RUNS)
    flush_search_index_pending_lists()
    after = explain_search(mine, "kestrel")
    assert pages_read(after) == pages_read(before), (before, after)
    assert rows_looked_at(after) == 0, after


@pytest.mark.parametrize(
    "search",
    [
        "été",
        "ÉTÉ",
        "são_paulo",
        "o_pau",
        "100%",
        "wörld",
        "ÖRL",
        "x-ray 4",
        "C:\\temp",
        'say "hi"',
        "ab cde",
        "ünïcödé",
        "12345",
        "oscorp",
    ],
)
def test_the_index_finds_exactly_what_reading_every_run_finds(db, monkeypatch, search):
    """Through the index (a window of one run) the search returns the runs a plain ILIKE of each one keeps."""
    monkeypatch.setattr(selectors, "SEARCH_WINDOW", 1)
    tenant = TenantFactory()
    texts = [
        "Été à São_Paulo",
        "ete a sao paulo",
        "Hello Wörld",
        "100% X-Ray 4",
        "x ray 45",
        "path C:\\temp\\x",
        'they say "hi"',
        "ab cdef",
        "ÜNÏCÖDÉ 12345",
        "Oscorp of NYC",
        "nothing to see",
    ]
    for text in texts:
        submit_run(tenant=tenant, kind="silent", input={"customer": text, "note": text.upper()})
    add_runs(TenantFactory(), texts)  # another tenant's identical runs are never found
    terms = selectors.search_terms(search)
    expected = list(
        Run.objects.for_tenant(tenant).newest_first().matching(terms).values_list("id", flat=True)
    )
    found = [run.id for run in selectors.list_runs(tenant=tenant, search=search).items]
    assert expected  # each of these matches some run
    assert found == expected
