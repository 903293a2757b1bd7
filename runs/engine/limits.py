"""Global max_running per kind and per queue, across every worker and tenant.

An operator sets a limit (``manage.py setlimit kind|queue NAME
--max-running N``, or the admin); the claim enforces it as it enforces a
tenant's ``max_running``: a guarded counter on the kind's (``KindState``)
or queue's (``Queue``) row, bumped under the row's lock by the statement
that claims, re-checked on the row's latest version, so concurrent claims
never overshoot; the one exit from running gives the slot back in its own
statement. The counter is written only while a limit is set, so an
unlimited kind costs the claim nothing. The reaper sets the counters to the
truth on every pass (``reconcile``), under the rows' locks.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from runs.engine.limits_seen import limits_seen
from runs.models import KindState, Queue
from runs.queries import one, queries, rows

SCOPES = ("kind", "queue")


@dataclass(frozen=True)
class Limit:
    scope: str  # "kind" or "queue"
    name: str
    max_running: int | None  # None: no limit
    running: int  # its runs running now, as the counter says


def set_max_running(scope: str, name: str, max_running: int | None) -> Limit:
    """Set (or with None lift) the global max_running of kind or queue ``name``; idempotent.

    The counter is set to the count of the runs running now, under the
    row's lock, so the limit holds from the commit on.
    """
    if scope not in SCOPES:
        raise ValueError(f"a limit is on a kind or a queue, not {scope!r}")
    if max_running is not None and (isinstance(max_running, bool) or max_running < 0):
        raise ValueError(f"max_running is a whole number of at least 0, not {max_running}")
    model = KindState if scope == "kind" else Queue
    with transaction.atomic():
        model.objects.get_or_create(name=name)
        row = model.objects.select_for_update(no_key=True).get(name=name)
        running = 0
        if max_running is not None:
            with (
                connection.cursor() as cursor
            ):  # a new statement: it sees every claim before the lock
                cursor.execute(
                    queries.count_running_of_kind
                    if scope == "kind"
                    else queries.count_running_of_queue,
                    {"name": name},
                )
                counted = one(cursor)
                running = counted["n"] if counted else 0
        row.max_running = max_running
        row.running = running
        row.save(update_fields=["max_running", "running"])
        transaction.on_commit(limits_seen.forget)
    return Limit(scope=scope, name=name, max_running=max_running, running=running)


def limits() -> list[Limit]:
    """Every global limit in force, kinds first."""
    found = [
        Limit("kind", k.name, k.max_running, k.running)
        for k in KindState.objects.filter(max_running__isnull=False).order_by("name")
    ]
    return found + [
        Limit("queue", q.name, q.max_running, q.running)
        for q in Queue.objects.filter(max_running__isnull=False).order_by("name")
    ]


def reconcile() -> int:
    """Set every limited kind's and queue's counter to its running runs; returns how many were off."""
    fixed = 0
    for lock, fix in (
        (queries.lock_limited_kinds, queries.fix_kind_counters),
        (queries.lock_limited_queues, queries.fix_queue_counters),
    ):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(lock)
            if not cursor.fetchall():
                continue
            cursor.execute(fix)
            fixed += len(rows(cursor))
    return fixed
