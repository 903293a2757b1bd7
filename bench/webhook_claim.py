"""Webhook claim benchmark: the fair claim (round-robin across tenants) under a backlog.

    .venv/bin/python bench/webhook_claim.py
    .venv/bin/python bench/webhook_claim.py --backlogs 0,1000,10000,100000 --iterations 50

One tenant (A) has a backlog of due deliveries, another (B) one due
delivery. Each timed claim is ``runs.webhooks.deliveries.claim`` as the
delivery loop calls it (8 slots, nothing in flight); the claimed rows are
given back untimed, so every claim meets the same table. It prints the
claim's p50 and p99 and how many of the claims took B's delivery (all of
them should: B's turn comes with A's first). Like the other benches it
works in a database ``bench_<pid>`` of its own, dropped at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import Database, pct, say, sql  # noqa: E402

SLOTS = 8


def tenant_with_one_delivery(slug: str):
    from runs.events import SYSTEM, append_event
    from runs.models import Tenant, WebhookDelivery
    from runs.services import submit_run

    tenant = Tenant.objects.create(name=slug, slug=slug, max_running=10, max_queued=10)
    run = submit_run(
        tenant=tenant, kind="bench_noop", input={}, callback_url=f"https://{slug}.example.com/hook"
    )
    append_event(run_id=run.pk, type="run.done", actor=SYSTEM)
    return tenant, WebhookDelivery.objects.get(run=run)


def set_backlog(delivery, size: int) -> None:
    sql(
        "DELETE FROM runs_webhookdelivery WHERE tenant_id = %(t)s AND id <> %(id)s",
        {"t": delivery.tenant_id, "id": delivery.pk},
    )
    sql(
        """INSERT INTO runs_webhookdelivery (event_id, run_id, tenant_id, url, event_type, webhook_id, status,
               attempts, next_attempt_at, response_body, last_error, created_at)
           SELECT event_id, run_id, tenant_id, url, event_type, webhook_id || '_' || n, 'pending', 0,
                  statement_timestamp() - make_interval(secs => 3600 - n * 0.001), '', '', statement_timestamp()
           FROM runs_webhookdelivery, generate_series(1, %(n)s) AS n WHERE id = %(id)s""",
        {"id": delivery.pk, "n": size},
    )
    sql("VACUUM ANALYZE runs_webhookdelivery")


def give_back(ids: list[int]) -> None:
    sql(
        """UPDATE runs_webhookdelivery SET status = 'pending', attempts = attempts - 1,
               next_attempt_at = statement_timestamp() - interval '1 second' WHERE id = ANY(%(ids)s)""",
        {"ids": ids},
    )


def run(args) -> None:
    from runs.webhooks import deliveries, receivers

    _, a_first = tenant_with_one_delivery("a")
    b, _ = tenant_with_one_delivery("b")
    # A's deliveries are older than B's: a claim by due time alone would take A's first.
    sql(
        "UPDATE runs_webhookdelivery SET next_attempt_at = statement_timestamp() - interval '2 hours' "
        "WHERE id = %(id)s",
        {"id": a_first.pk},
    )
    say(f"{'A backlog':>10} {'p50 ms':>8} {'p99 ms':>8} {'B claimed':>10} {'A per claim':>12}")
    for size in args.backlogs:
        set_backlog(a_first, size)
        times, with_b, of_a = [], 0, []
        for _ in range(args.iterations):
            started = time.perf_counter()
            jobs = deliveries.claim(batch=SLOTS, lease_seconds=60, slots=SLOTS, in_flight={})
            times.append((time.perf_counter() - started) * 1000)
            with_b += any(job.tenant_id == b.pk for job in jobs)
            of_a.append(sum(job.tenant_id != b.pk for job in jobs))
            give_back([job.id for job in jobs])
        say(
            f"{size + 1:>10,} {pct(times, 50):>8.2f} {pct(times, 99):>8.2f} "
            f"{with_b:>5}/{args.iterations:<4} {max(of_a):>12}"
        )
    # The last backlog again, its receiver paused and its deliveries parked (as the loop does).
    sql(
        "INSERT INTO runs_webhookreceiver (tenant_id, receiver, silent_attempts, last_error, paused_at, "
        "paused_reason, resumed_by) VALUES (%(t)s, 'https://a.example.com', 5, '', now(), 'bench', '')",
        {"t": a_first.tenant_id},
    )
    started = time.perf_counter()
    parked = receivers.park()
    say(
        f"(parking {parked:,} deliveries of the paused receiver took {(time.perf_counter() - started) * 1000:.0f} ms)"
    )
    times = []
    for _ in range(args.iterations):
        started = time.perf_counter()
        jobs = deliveries.claim(batch=SLOTS, lease_seconds=60, slots=SLOTS, in_flight={})
        times.append((time.perf_counter() - started) * 1000)
        give_back([job.id for job in jobs])
    say(
        f"{args.backlogs[-1] + 1:>10,} {pct(times, 50):>8.2f} {pct(times, 99):>8.2f}   (A's receiver paused)"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backlogs",
        default="0,1000,10000,100000",
        type=lambda text: [int(n) for n in text.split(",")],
    )
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args(argv)
    db = Database(agent_modules="bench.agents")
    try:
        db.setup()
        say(f"PostgreSQL : {db.version.split(' on ')[0]}; {SLOTS} slots, nothing in flight")
        run(args)
        return 0
    finally:
        db.drop()


if __name__ == "__main__":
    sys.exit(main())
