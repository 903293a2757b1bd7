"""Search isolation benchmark: can a tenant's search time tell how common a word is in other tenants' runs?

    .venv/bin/python bench/search_isolation.py                         # this checkout, 1,000,000 runs
    .venv/bin/python bench/search_isolation.py --base /tmp/base        # and another checkout, side by side
    .venv/bin/python bench/search_isolation.py --runs 200000 --repeat 50
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/search_isolation.py

The runs are bench/list_search.py's (one ``INSERT ... SELECT generate_series``
per tenant): 60% in a big tenant, 30% in a second one where a third of the
runs say "Kestrel", ten small tenants of 1%. The victim is the first small
tenant (10,000 runs at a million), which never says "Kestrel"; the big tenant
is measured too. For each, ``runs.selectors.list_runs`` (the dashboard's
first page of 50) searching (a) a word common only in another tenant, (b) a
word that exists nowhere, of as many letters, (c) a word common in its own
runs, (d) a word in 0.1% of its runs; the cases interleaved, ``--repeat``
times each after a warm-up; p50 and p95, and from ``EXPLAIN (ANALYZE,
BUFFERS)`` of each statement the pages it read and the rows it looked at
(index entries found, heap rows filtered or rechecked), and the plan of the
statement that reads the search index. Then the submit rate: ``--submits``
runs through ``runs.services.submit_run``, one at a time, into the full table.

With ``--base DIR`` the same measurement first runs in the checkout DIR (this
file is copied into its bench/, e.g. a ``git worktree add DIR 7a0944f``), each
in a database ``bench_<pid>`` of its own, dropped at the end, and the figures
are printed side by side.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, pct, say, sql  # noqa: E402

CASES = [
    # (label, search text)
    ("(a) common only in another tenant", "kestrel"),
    ("(b) in no run at all", "qwxyzzy"),
    ("(c) common in its own runs", "contract"),
    ("(d) in 0.1% of its own runs", "wombat"),
]


def search_index_names(model) -> list[str]:
    """The run search's GIN index of this checkout (its name changed with its keys)."""
    return [index.name for index in model._meta.indexes if index.name.startswith("run_search")]


def fill(args) -> dict:
    from django.db import connection

    from bench.list_search import SMALL_TENANTS, insert_runs
    from runs.models import Run, Tenant

    def tenant(slug):
        return Tenant.objects.create(name=slug, slug=slug, max_queued=10_000_000)

    big, mid = tenant("big"), tenant("mid")
    small = [tenant(f"small-{i}") for i in range(SMALL_TENANTS)]
    n_big, n_mid = args.runs * 6 // 10, args.runs * 3 // 10
    n_small = (args.runs - n_big - n_mid) // SMALL_TENANTS
    names = search_index_names(Run)
    for name in names:  # built after the fill, as a migration builds it on an existing table
        sql(f'DROP INDEX "{name}"')
    started = time.perf_counter()
    insert_runs(big, n_big, offset=0)
    insert_runs(mid, n_mid, offset=n_big, tenant_word="Kestrel")
    for i, each in enumerate(small):
        insert_runs(each, n_small, offset=n_big + n_mid + i * n_small)
    inserted = time.perf_counter() - started
    started = time.perf_counter()
    with connection.schema_editor() as editor:
        for index in Run._meta.indexes:
            if index.name in names:
                editor.add_index(Run, index)
    built = time.perf_counter() - started
    size = sql(
        "SELECT pg_size_pretty(sum(pg_relation_size(i::regclass))), pg_size_pretty(pg_relation_size('runs_run'))"
        " FROM unnest(%s::text[]) AS i",
        [names],
    )[0]
    sql("VACUUM ANALYZE runs_run")
    sql("CHECKPOINT")
    return {
        "tenants": {
            "victim": (small[0], f"victim, {n_small:,} runs"),
            "big": (big, f"big, {n_big:,} runs"),
        },
        "info": {
            "index": ", ".join(names),
            "inserted_s": inserted,
            "built_s": built,
            "index_size": size[0],
            "table_size": size[1],
            "runs": n_big + n_mid + n_small * SMALL_TENANTS,
        },
    }


def statements(tenant, search) -> list[tuple[str, list]]:
    """What list_runs sends for the dashboard's first page, captured from the selector itself."""
    from django.db import connection

    from runs import selectors

    captured: list[tuple[str, list]] = []

    def capture(execute, query, params, many, context):
        captured.append((query, list(params or [])))
        return execute(query, params, many, context)

    with connection.execute_wrapper(capture):
        selectors.list_runs(tenant=tenant, limit=50, without_payloads=True, search=search)
    return captured


def explain(query: str, params: list) -> dict:
    [[result]] = sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params)
    return (json.loads(result) if isinstance(result, str) else result)[0]["Plan"]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def plan_text(query: str, params: list) -> str:
    return "\n".join(
        row[0] for row in sql("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + query, params)
    )


def measure_tenant(tenant, repeat: int) -> dict:
    from runs import selectors

    def search(text):
        return selectors.list_runs(tenant=tenant, limit=50, without_payloads=True, search=text)

    for _ in range(5):
        for _, text in CASES:
            search(text)
    timings: dict[str, list[float]] = {text: [] for _, text in CASES}
    for _ in range(repeat):  # interleaved: the machine's other load falls on every case alike
        for _, text in CASES:
            started = time.perf_counter()
            search(text)
            timings[text].append((time.perf_counter() - started) * 1000)
    cases = {}
    for label, text in CASES:
        sent = statements(tenant, text)
        plans = [explain(query, params) for query, params in sent]
        cases[text] = {
            "label": label,
            "p50": pct(timings[text], 50),
            "p95": pct(timings[text], 95),
            "found": len(search(text).items),
            "pages": sum(p["Shared Hit Blocks"] + p["Shared Read Blocks"] for p in plans),
            "rows": sum(
                n["Actual Rows"] * n.get("Actual Loops", 1)
                + n.get("Rows Removed by Filter", 0)
                + n.get("Rows Removed by Index Recheck", 0)
                for p in plans
                for n in nodes(p)
            ),
            "indexes": sorted(
                {n["Index Name"] for p in plans for n in nodes(p) if "Index Name" in n}
            ),
            "last_plan": plan_text(*sent[-1]),
        }
    return cases


def submit_rate(n: int) -> float:
    from runs.models import Tenant
    from runs.services import submit_run

    tenant = Tenant.objects.create(name="submitter", slug="submitter", max_queued=10_000_000)
    started = time.perf_counter()
    for i in range(n):
        submit_run(
            tenant=tenant,
            kind="bench_noop",
            input={
                "customer": f"Lead {i}: Called back about the renewal contract (Ana Lopez, Lyon, Globex Robotics)",
                "i": i,
            },
        )
    rate = n / (time.perf_counter() - started)
    from runs.notify import uncounted_submits

    waited = time.monotonic() + 5
    while (
        uncounted_submits(tenant.pk) and time.monotonic() < waited
    ):  # its debounced UPDATE lands before the drop
        time.sleep(0.01)
    return rate


def measure(args) -> dict:
    from django.db import connection

    filled = fill(args)
    result = {
        "info": {**filled["info"], "server": connection.cursor().connection.info.server_version},
        "tenants": {},
    }
    for key, (tenant, label) in filled["tenants"].items():
        result["tenants"][key] = {"label": label, "cases": measure_tenant(tenant, args.repeat)}
    result["info"]["submits_per_s"] = submit_rate(args.submits)
    return result


def in_checkout(checkout: Path, args) -> dict:
    """The measurement run by ``checkout``'s code (this file copied into it), in a process of its own."""
    if checkout.resolve() != ROOT:
        shutil.copy(__file__, checkout / "bench" / Path(__file__).name)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [
                sys.executable,
                str(checkout / "bench" / Path(__file__).name),
                "--runs",
                str(args.runs),
                "--repeat",
                str(args.repeat),
                "--submits",
                str(args.submits),
                "--json",
                out.name,
            ],
            cwd=checkout,
            check=True,
        )
        return json.loads(Path(out.name).read_text())


def side_by_side(results: list[tuple[str, dict]]) -> None:
    say()
    for name, result in results:
        info = result["info"]
        say(
            f"{name:6}: {info['runs']:,} runs inserted in {info['inserted_s']:.0f} s; {info['index']} built in "
            f"{info['built_s']:.1f} s, {info['index_size']} (table {info['table_size']}); "
            f"submit_run {info['submits_per_s']:.0f}/s"
        )
    for key in results[0][1]["tenants"]:
        say()
        say(
            f"{results[0][1]['tenants'][key]['label']:46}"
            + "".join(f" | {name:^32}" for name, _ in results)
        )
        say(f"{'search':46}" + " | p50 ms  p95 ms   pages    rows found" * len(results))
        for text, case in results[0][1]["tenants"][key]["cases"].items():
            line = f"{case['label'] + ' ' + repr(text):46}"
            for _, result in results:
                c = result["tenants"][key]["cases"][text]
                line += f" | {c['p50']:6.2f}  {c['p95']:6.2f} {c['pages']:7d} {c['rows']:7d} {c['found']:5d}"
            say(line)
    for name, result in results:
        for key in ("victim", "big"):
            for text in ("kestrel", "qwxyzzy"):
                case = result["tenants"][key]["cases"][text]
                say(
                    f"\n--- {name}, {result['tenants'][key]['label']}, {case['label']} {text!r}: the last statement"
                )
                say(case["last_plan"])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--runs", type=int, default=1_000_000, help="runs in all (default 1,000,000)"
    )
    parser.add_argument(
        "--repeat", type=int, default=200, help="timed searches per case (default 200)"
    )
    parser.add_argument(
        "--submits",
        type=int,
        default=2000,
        help="runs submitted for the submit rate (default 2000)",
    )
    parser.add_argument(
        "--base", type=Path, help="another checkout to measure first, shown beside this one"
    )
    parser.add_argument(
        "--json", type=Path, help=argparse.SUPPRESS
    )  # one measurement, written for the parent
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(SystemExit(143)))
    if args.json:
        database = Database(agent_modules="bench.agents")
        try:
            database.setup()
            args.json.write_text(json.dumps(measure(args)))
            return 0
        finally:
            database.drop()
    results = []
    if args.base:
        results.append(("before", in_checkout(args.base, args)))
    results.append(("after" if args.base else "this", in_checkout(ROOT, args)))
    side_by_side(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
