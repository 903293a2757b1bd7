"""Planning time of the engine's hot statements: what each CTE a statement carries costs every execution.

    .venv/bin/python bench/plan_cost.py              # 300 plans of each statement, medians
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres .venv/bin/python bench/plan_cost.py

Django sends every statement as text, so PostgreSQL plans each execution
anew: a CTE or a subquery that touches no row still costs its planning.
This prints the median ``Planning Time`` of ``EXPLAIN (SUMMARY ON)`` for the
checkpoint (a no-op step, a step that consumes messages, a compensation),
the exit from running and the step failure, on a fresh
database of its own, which it drops.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import Database, say  # noqa: E402


def planning_ms(statement: str, params: dict) -> float:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (SUMMARY ON) " + statement, params)
        text = "\n".join(row[0] for row in cursor.fetchall())
    return float(re.search(r"Planning Time: ([\d.]+)", text).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--plans", type=int, default=300, help="plans of each statement (default 300)"
    )
    args = parser.parse_args()
    db = Database()
    try:
        db.setup()
        from runs.engine import exit as exits
        from runs.engine import recordset, steps
        from runs.queries import queries

        run_id = uuid.uuid4()
        step = steps.StepRecord(
            run_id=run_id,
            token=1,
            generation=1,
            seq=1,
            name="step",
            kind="custom",
            input=None,
            started_at=datetime.now(UTC),
        )
        item = steps.Checkpoint.of(step, output={"a": 1}, steps_total=None)
        checkpoint = {
            "rows": recordset.rows([item]),
            "run": [run_id],
            "lock": [run_id],
            "running": "running",
            "lease": 300,
            "worker": run_id,
            "message_ids": [1],
            "compensates": 1,
        }
        failure = step.params() | {
            "error": "boom",
            "error_kind": "fatal",
            "worker": run_id,
            "status": "failed",
        }
        exit = exits.Exit.done(result='{"a": 1}').of_run(run_id, 1, actor_id="w")
        leave = {
            "rows": recordset.rows([exit]),
            "run": [run_id],
            "expires": 3600,
            "running": "running",
        }
        cases = {
            "checkpoint of a no-op step": (queries.checkpoint, checkpoint),
            "checkpoint consuming messages": (queries.checkpoint_consuming_messages, checkpoint),
            "checkpoint of a compensation": (queries.checkpoint_compensation, checkpoint),
            "exit from running": (queries.leave_running, leave),
            "step failure": (queries.record_step_failure, failure),
        }
        say(f"PostgreSQL: {db.version.split(',')[0]}; {args.plans} plans of each statement")
        for name, (statement, params) in cases.items():
            planning_ms(statement, params)  # warm the catalog caches
            times = [planning_ms(statement, params) for _ in range(args.plans)]
            say(
                f"  {name:45s} planning p50 {statistics.median(times):.3f} ms, "
                f"p90 {statistics.quantiles(times, n=10)[-1]:.3f} ms"
            )
    finally:
        db.drop()


if __name__ == "__main__":
    main()
