"""Run search benchmark: the dashboard's list query with a search, over a million runs (issue 13).

    .venv/bin/python bench/list_search.py                    # 1,000,000 runs (a few minutes in all)
    .venv/bin/python bench/list_search.py --runs 200000      # smaller
    .venv/bin/python bench/list_search.py --fulltext         # also time a full-text index, for comparison
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/list_search.py

Like the other benchmarks it uses DATABASE_URL or the embedded PostgreSQL,
in a database ``bench_<pid>`` of its own, dropped at the end.

The fill is one ``INSERT ... SELECT generate_series`` per tenant (the
search index dropped first and built afterwards, timed, as the
migration builds it on an existing table): realistic inputs and titles of
the four example kinds (examples/: CRM updates, research questions, briefs, deploys)
over a month, 60% of the runs in one big tenant, 30% in a second one, the
rest in ten small ones. One word is rare (about 20 runs), three uncommon (0.1%,
1% and 2%), one common (about a quarter of them), and one is common in the
second tenant only, so a plan that trusts the table-wide statistics walks
the big tenant for nothing.

Each case runs ``runs.selectors.list_runs`` itself (the first page, 50
rows, without the payload columns, as the dashboard asks) ``--repeat``
times after a warm-up, and prints p50 / p95, the rows found, and the index
or indexes its ``EXPLAIN (ANALYZE)`` plan used.
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.admin_million import insert_select  # noqa: E402
from bench.common import Database, pct, say, sql  # noqa: E402

SEARCH_INDEX = "run_search_keys_idx"
SPAN_S = 30 * 24 * 3600  # a month of runs, the newest now
SMALL_TENANTS = 10

# Vocabulary of the inputs (SQL arrays, indexed by g).
COMPANIES = (
    "ARRAY['Acme', 'Globex', 'Initech', 'Umbrella', 'Hooli', 'Stark', 'Wayne', 'Tyrell', 'Soylent',"
    " 'Cyberdyne', 'Vandelay', 'Wonka', 'Oscorp', 'Massive', 'Pied Piper', 'Aperture', 'Black Mesa',"
    " 'Monarch', 'Gringotts', 'Duff']"
)
SECTORS = "ARRAY['Robotics', 'Foods', 'Logistics', 'Energy', 'Labs', 'Systems', 'Health', 'Media', 'Capital', 'Motors']"
CITIES = (
    "ARRAY['Lisbon', 'Lyon', 'Leeds', 'Austin', 'Osaka', 'Porto', 'Graz', 'Turin', 'Ghent', 'Malmo', 'Cork',"
    " 'Bilbao']"
)
PEOPLE = "ARRAY['Kim Lee', 'Ana Lopez', 'Sam Okafor', 'Mia Chen', 'Tom Berg', 'Eva Novak', 'Raj Iyer', 'Lea Roth']"
INSTRUCTIONS = (
    "ARRAY['They signed the contract today', 'Called back about the renewal contract',"
    " 'Asked for a new quote before Friday', 'Met them at the trade fair', 'Went with a competitor',"
    " 'Budget confirmed for next quarter', 'Sent the contract draft to legal',"
    " 'No answer after three emails']"
)
QUESTIONS = (
    "ARRAY['How does a worker avoid running a step twice after a crash?',"
    " 'What happens to a run when its worker is killed?', 'When is a contract step retried?',"
    " 'How are approvals recorded?', 'Which errors are retryable?']"
)
REGIONS = "ARRAY['eu-west', 'us-east', 'ap-south']"

CASES = [
    # (label, search text)
    ("no search", None),
    ("rare word", "zanzibar"),
    ("uncommon word (0.1%)", "wombat"),
    ("uncommon word (1%)", "quokka"),
    ("uncommon word (2%)", "platypus"),
    ("common word", "contract"),
    ("3-letter fragment", "cme"),
    ("two words", "renewal acme"),
    ("no match", "qwxyzzy"),
    ("common in another tenant only", "kestrel"),
]


def insert_runs(tenant, n: int, *, offset: int, tenant_word: str = "") -> None:
    """n runs of ``tenant`` over the month, interleaved in time with the other tenants' (g from offset)."""
    from runs.models import Run

    company = (
        f"({COMPANIES})[1 + g %% 20] || ' ' || ({SECTORS})[1 + (g / 20) %% 10]"
        " || CASE WHEN g %% 50000 = 17 THEN ' Zanzibar' ELSE '' END"
        " || CASE WHEN g %% 97 = 5 THEN ' Quokka' WHEN g %% 1009 = 3 THEN ' Wombat'"
        " WHEN g %% 53 = 7 THEN ' Platypus' ELSE '' END"
        " || CASE WHEN %(word)s <> '' AND g %% 3 = 0 THEN ' ' || %(word)s ELSE '' END"
    )
    instruction = (
        f"({INSTRUCTIONS})[1 + (g / 7) %% 8] || ' (' || ({PEOPLE})[1 + g %% 8] || ', '"
        f" || ({CITIES})[1 + (g / 3) %% 12] || ', ' || {company} || ')'"
    )
    app = f"lower(({COMPANIES})[1 + g %% 20]) || '-' || (g %% 97)"
    region = f"({REGIONS})[1 + g %% 3]"
    kind = "(ARRAY['crm_update', 'crm_update', 'research', 'research_brief', 'deploy_app'])[1 + g %% 5]"
    source = (
        "(SELECT g, k, statement_timestamp() - make_interval(secs => %(span)s::float8 * (g - %(first)s + 1) / %(n)s)"
        " AS created"
        f" FROM (SELECT g, {kind} AS k FROM generate_series(%(first)s, %(last)s) AS g) AS gk) AS s"
    )
    inputs = f"""CASE k
        WHEN 'crm_update' THEN jsonb_build_object('lead_id', 1 + g %% 5000, 'instruction', {instruction})
        WHEN 'research' THEN jsonb_build_object('question', ({QUESTIONS})[1 + (g / 5) %% 5] || ' (' || {company} || ')',
                                                'max_sources', 3)
        WHEN 'research_brief' THEN jsonb_build_object('topic', {company}, 'depth', 3)
        ELSE jsonb_build_object('app', {app}, 'region', {region}) END"""
    titles = f"""CASE k
        WHEN 'crm_update' THEN 'Lead ' || (1 + g %% 5000) || ': ' || {instruction}
        WHEN 'research' THEN ({QUESTIONS})[1 + (g / 5) %% 5] || ' (' || {company} || ')'
        WHEN 'research_brief' THEN {company}
        ELSE 'Deploy ' || {app} || ' to ' || {region} END"""
    rows = {
        "id": "gen_random_uuid()",
        "tenant_id": "%(tenant)s",
        "kind": "k",
        "input": inputs,
        "title": f"left({titles}, 200)",
        "status": "'done'",
        "attempt": "1",
        "outcome": "CASE WHEN g %% 11 = 0 THEN 'unchanged' ELSE 'succeeded' END",
        "summary": "CASE WHEN k = 'crm_update' THEN 'Moved the lead to won' ELSE 'Answered from 2 documents' END",
        "created_at": "created",
        "updated_at": "created",
        "started_at": "created + interval '1 second'",
        "finished_at": "created + interval '20 seconds'",
        "expires_at": "created + interval '7 days'",
        "request_hash": "md5(g::text)",
        "steps_total": "6",
        "steps_done": "6",
        "last_event_seq": "6",
        "result": "jsonb_build_object('answer', repeat('lorem ipsum ', 40))",
    }
    insert_select(
        Run,
        rows,
        source,
        {
            "tenant": tenant.pk,
            "first": offset + 1,
            "last": offset + n,
            "n": n,
            "span": SPAN_S,
            "word": tenant_word,
        },
    )


def list_queries(tenant, search):
    """The statements list_runs sends for the dashboard's first page, captured from the selector itself."""
    from django.db import connection

    from runs import selectors

    captured: list[tuple[str, list]] = []

    def capture(execute, query, params, many, context):
        captured.append((query, list(params or [])))
        return execute(query, params, many, context)

    with connection.execute_wrapper(capture):
        page = selectors.list_runs(tenant=tenant, limit=50, without_payloads=True, search=search)
    return captured, len(page.items)


def indexes_used(query: str, params: list) -> tuple[str, float]:
    rows = sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) " + query, params)
    plan = "\n".join(row[0] for row in rows)
    names = re.findall(
        r"(?:Index Scan|Index Only Scan|Bitmap Index Scan)(?: Backward)?(?: using| on) (\w+)", plan
    )
    scans = re.findall(r"Seq Scan on (\w+)", plan)
    used = ", ".join(dict.fromkeys(names)) or ("seq scan" if scans else "?")
    executed = float(re.search(r"Execution Time: ([\d.]+)", plan).group(1))
    return used, executed


def time_case(tenant, search, repeat: int) -> list[float]:
    from runs import selectors

    for _ in range(3):
        selectors.list_runs(tenant=tenant, limit=50, without_payloads=True, search=search)
    timings = []
    budget = time.perf_counter() + 60  # a pathological case stops early rather than taking minutes
    for _ in range(repeat):
        started = time.perf_counter()
        selectors.list_runs(tenant=tenant, limit=50, without_payloads=True, search=search)
        timings.append((time.perf_counter() - started) * 1000)
        if time.perf_counter() > budget:
            break
    return timings


def matches(tenant, search) -> int:
    from runs.models import Run
    from runs.selectors import search_terms

    runs = Run.objects.for_tenant(tenant)
    return (
        runs.count()
        if search is None
        else runs.matching(search_terms(search), tenant=tenant).count()
    )


def report(tenant, label_prefix: str, repeat: int) -> None:
    say(
        f"{'case (' + label_prefix + ')':44} {'p50 ms':>8} {'p95 ms':>8} {'rows':>5} {'matching':>9}"
        "  indexes used, by statement"
    )
    for label, search in CASES:
        timings = time_case(tenant, search, repeat)
        statements, rows = list_queries(tenant, search)
        used = " | ".join(
            f"{indexes_used(query, params)[0]} ({indexes_used(query, params)[1]:.1f} ms)"
            for query, params in statements
        )
        say(
            f"{label + (f' {search!r}' if search else ''):44} {pct(timings, 50):8.2f} {pct(timings, 95):8.2f} "
            f"{rows:5d} {matches(tenant, search):9,d}  {used}"
        )


def words(expression):
    """``to_tsvector('simple', expression)``: the words of a text, for a full-text index."""
    from django.db.models import Func
    from django.db.models.fields import TextField

    return Func(
        expression,
        template="to_tsvector('simple'::regconfig, %(expressions)s)",
        output_field=TextField(),
    )


class Matches:
    """``words @@ to_tsquery('simple', query)``, a boolean expression to filter on."""

    def __new__(cls, vector, query: str):
        from django.db.models import BooleanField, Func, Value
        from django.db.models.fields import TextField

        tsquery = Func(
            Value(query),
            template="to_tsquery('simple'::regconfig, %(expressions)s)",
            output_field=TextField(),
        )
        return Func(
            vector,
            tsquery,
            template="(%(expressions)s)",
            arg_joiner=" @@ ",
            output_field=BooleanField(),
        )


def fulltext_comparison(tenants, repeat: int) -> None:
    """The same cases on a full-text GIN index of the same text (whole words and word prefixes only)."""
    from django.contrib.postgres.indexes import GinIndex
    from django.db import connection

    from runs.models import Run
    from runs.models.run import SearchText

    started = time.perf_counter()
    with connection.schema_editor() as editor:
        editor.add_index(Run, GinIndex(words(SearchText()), name="run_search_fts_bench"))
    built = time.perf_counter() - started
    size = sql("SELECT pg_size_pretty(pg_relation_size('run_search_fts_bench'))")[0][0]
    sql("ANALYZE runs_run")
    say(f"full-text index built in {built:.1f} s, {size}")
    for tenant, name in tenants:
        say(
            f"{'case (full text, ' + name + ')':44} {'p50 ms':>8} {'p95 ms':>8} {'rows':>5}  index used"
        )
        for label, search in CASES:
            if search is None:
                continue
            query = " & ".join(f"{word}:*" for word in search.split())
            qs = (
                Run.objects.for_tenant(tenant)
                .filter(Matches(words(SearchText()), query))
                .newest_first()
                .defer("input", "result", "error")
            )
            compiled_sql, params = qs[:51].query.sql_with_params()
            timings = []
            for _ in range(3 + repeat):
                started = time.perf_counter()
                found = sql(compiled_sql, list(params))
                timings.append((time.perf_counter() - started) * 1000)
            used, _ = indexes_used(compiled_sql, list(params))
            timings = timings[3:]
            say(
                f"{label + f' {query!r}':44} {pct(timings, 50):8.2f} {pct(timings, 95):8.2f} {len(found):5d}  {used}"
            )
    sql("DROP INDEX run_search_fts_bench")


def run(args) -> None:
    from django.db import connection

    from runs.models import Tenant

    big = Tenant.objects.create(name="Big", slug="big", max_queued=10_000_000)
    mid = Tenant.objects.create(name="Mid", slug="mid", max_queued=10_000_000)
    small = [
        Tenant.objects.create(name=f"Small {i}", slug=f"small-{i}", max_queued=10_000_000)
        for i in range(SMALL_TENANTS)
    ]
    n_big, n_mid = args.runs * 6 // 10, args.runs * 3 // 10
    n_small = (args.runs - n_big - n_mid) // SMALL_TENANTS

    from runs.models import Run

    sql(f"DROP INDEX {SEARCH_INDEX}")  # built after the fill, as the migration builds it
    started = time.perf_counter()
    insert_runs(big, n_big, offset=0)
    insert_runs(mid, n_mid, offset=n_big, tenant_word="Kestrel")
    for i, tenant in enumerate(small):
        insert_runs(tenant, n_small, offset=n_big + n_mid + i * n_small)
    total = n_big + n_mid + n_small * SMALL_TENANTS
    say(
        f"inserted   : {total:,} runs ({n_big:,} big, {n_mid:,} mid, {SMALL_TENANTS} x {n_small:,} small) "
        f"in {time.perf_counter() - started:.1f} s"
    )

    started = time.perf_counter()
    # The statement of migration 0018 (CONCURRENTLY there; the same index).
    index = next(i for i in Run._meta.indexes if i.name == SEARCH_INDEX)
    with connection.schema_editor() as editor:
        editor.add_index(Run, index)
    built = time.perf_counter() - started
    size = sql(
        f"SELECT pg_size_pretty(pg_relation_size('{SEARCH_INDEX}')),"
        " pg_size_pretty(pg_relation_size('runs_run'))"
    )[0]
    say(f"search idx : built in {built:.1f} s, {size[0]} (the table: {size[1]})")
    sql("VACUUM ANALYZE runs_run")
    sql("CHECKPOINT")
    say(f"PostgreSQL : {connection.cursor().connection.info.server_version}")
    say()
    report(big, f"big tenant, {n_big:,} runs", args.repeat)
    say()
    report(small[0], f"small tenant, {n_small:,} runs", args.repeat)
    if args.fulltext:
        say()
        fulltext_comparison([(big, "big"), (small[0], "small")], args.repeat)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=1_000_000, help="runs in all (default 1,000,000)"
    )
    parser.add_argument(
        "--repeat", type=int, default=30, help="timed queries per case (default 30)"
    )
    parser.add_argument(
        "--fulltext", action="store_true", help="also time a full-text index of the same text"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    database = Database()
    try:
        database.setup()
        say(f"database   : {database.name} ({database.version.split(',')[0]})")
        run(args)
        return 0
    finally:
        database.drop()


if __name__ == "__main__":
    sys.exit(main())
