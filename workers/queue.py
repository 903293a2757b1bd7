"""The queue's SQL: claim, heartbeat, checkpoint and the one exit from running.

Raw SQL on purpose: each of these is a single statement (data-modifying CTEs)
so that the claim, a checkpoint and an exit are each one round trip and one
atomic change, fenced on the run's lease token. Times are the database's
``statement_timestamp()`` (Django's ``Now()``), never an app server's clock. The ORM cannot say
``FOR UPDATE SKIP LOCKED`` inside a LATERAL join, nor write three tables in
one statement. Every statement here runs in autocommit on the calling
thread's Django connection, which the caller hands back to the pool.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import OperationalError, connection, transaction

logger = logging.getLogger(__name__)

TERMINAL = ("done", "failed", "cancelled")


def release_connection() -> None:
    """Hand this thread's connection back to the pool, unless a transaction still needs it.

    A run waiting on a model or a tool must hold no connection; called after
    each statement of the worker and the reaper.
    """
    if not connection.in_atomic_block:
        connection.close()


def with_retries(fn, *, attempts: int = 5, what: str = "statement"):
    """Call ``fn`` again after a deadlock, a serialization failure or a lost connection.

    For fenced statements only: a retry of one that did commit finds its
    guard no longer matching and changes nothing.
    """
    delay = 0.05
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except OperationalError as exc:
            release_connection()  # a broken connection goes back to the pool to be discarded
            if attempt == attempts:
                raise
            logger.warning("%s failed (%s); retrying in %.2fs", what, exc.__class__.__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)


def dumps(value: Any) -> str:
    return json.dumps(value, cls=DjangoJSONEncoder, separators=(",", ":"))


def loads(value: Any) -> Any:
    """jsonb from a raw cursor: Django's connections hand it over undecoded."""
    return json.loads(value) if isinstance(value, str | bytes) else value


@dataclass
class ClaimedRun:
    id: UUID
    tenant_id: UUID
    kind: str
    kind_version: int | None
    input: Any
    lease_token: int
    attempt: int
    failures: int
    max_attempts: int
    generation: int
    deadline_seconds: int
    running_seconds: float
    steps_done: int
    steps_total: int | None
    cost_cents: Decimal
    cost_ceiling_cents: Decimal | None
    cancel_requested: bool
    pause_requested: bool
    queue: str
    claimed_at: datetime


_CLAIM_COLUMNS = (
    "id, tenant_id, kind, kind_version, input, lease_token, attempt, failures, max_attempts, generation, "
    "deadline_seconds, running_seconds, steps_done, steps_total, cost_cents, cost_ceiling_cents, "
    "cancel_requested_at IS NOT NULL, pause_requested_at IS NOT NULL, queue, claimed_at"
)

# Walk tenant by tenant: only tenants that are not paused and have a free
# slot are visited, and each contributes at most its free slots, so a tenant
# at its limit with 100,000 queued runs costs the claim nothing. Inside a
# tenant the LATERAL scan follows run_claim_idx in its order. The tenant
# counter is bumped by a guarded update (re-checked on the latest row
# version under READ COMMITTED), so concurrent claims never overshoot
# max_running; a tenant whose bump fails keeps its runs queued.
_CLAIM_SQL = """
WITH returns AS (
    -- Slots of runs this worker finished since its last claim: given back here,
    -- once per claim instead of once per exit, so that a busy tenant's row is
    -- not written by every run that ends.
    SELECT * FROM unnest(%(ret_tenants)s::uuid[], %(ret_counts)s::int[]) AS x(tenant_id, n)
),
tenants AS (
    SELECT t.id, t.max_running - t.running + COALESCE(ret.n, 0) AS free
    FROM runs_tenant t LEFT JOIN returns ret ON ret.tenant_id = t.id
    WHERE NOT t.paused AND t.running - COALESCE(ret.n, 0) < t.max_running
      AND (t.daily_cost_cap_cents IS NULL OR t.daily_cost_cap_cents > COALESCE(
          (SELECT c.cost_cents FROM runs_tenantdailycost c
           WHERE c.tenant_id = t.id AND c.day = (statement_timestamp() AT TIME ZONE 'UTC')::date), 0))
),
candidates AS (
    SELECT c.*
    FROM tenants t
    CROSS JOIN LATERAL (
        SELECT r.id, r.tenant_id, r.priority, (r.started_at IS NULL) AS fresh, r.run_after
        FROM runs_run r
        WHERE r.tenant_id = t.id
          AND r.status = 'queued'
          AND {queue_filter}
          AND r.run_after <= statement_timestamp()
          AND r.kind = ANY(ARRAY(SELECT unnest(%(kinds)s::text[])
                                 EXCEPT SELECT k.name FROM runs_kindstate k WHERE k.paused))
        ORDER BY r.priority, (r.started_at IS NULL), r.run_after, r.id
        LIMIT LEAST(t.free, %(n)s)
        FOR UPDATE SKIP LOCKED
    ) c
),
picked AS (
    SELECT * FROM candidates ORDER BY priority, fresh, run_after, id LIMIT %(n)s
),
per_tenant AS (
    SELECT tenant_id, count(*) AS n FROM picked GROUP BY tenant_id
),
changes AS (
    SELECT COALESCE(p.tenant_id, ret.tenant_id) AS tenant_id, COALESCE(p.n, 0) AS n, COALESCE(ret.n, 0) AS returned
    FROM per_tenant p FULL JOIN returns ret ON ret.tenant_id = p.tenant_id
),
-- Tenant rows are locked in id order, so that concurrent claims over
-- several tenants cannot deadlock on them; the values read under the lock
-- are the latest, so the guard below cannot overshoot max_running.
locked_tenants AS (
    SELECT t.id, t.running, t.max_running FROM runs_tenant t
    WHERE t.id IN (SELECT tenant_id FROM changes)
    ORDER BY t.id FOR NO KEY UPDATE
),
decided AS (
    SELECT c.tenant_id, c.returned,
           CASE WHEN l.running + c.n - c.returned <= l.max_running THEN c.n ELSE 0 END AS n
    FROM changes c JOIN locked_tenants l ON l.id = c.tenant_id
),
bumped AS (
    -- queued may dip below 0 for a moment: a run can be claimed before the
    -- increment of its submit (sent after commit) lands; they cancel out.
    UPDATE runs_tenant t SET running = GREATEST(t.running + d.n - d.returned, 0), queued = t.queued - d.n
    FROM decided d
    WHERE t.id = d.tenant_id
),
claimed AS (
    UPDATE runs_run r SET
        status = 'running',
        lease_token = nextval('runs_lease_token_seq'),
        locked_by = %(worker)s,
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s),
        claimed_at = statement_timestamp(),
        heartbeat_at = statement_timestamp(),
        attempt = r.attempt + 1,
        kind_version = COALESCE(r.kind_version, v.version),
        started_at = COALESCE(r.started_at, statement_timestamp()),
        updated_at = statement_timestamp(),
        last_event_seq = r.last_event_seq + 1
    FROM picked p
    JOIN unnest(%(kinds)s::text[], %(versions)s::int[]) AS v(kind, version) ON true
    WHERE r.id = p.id AND r.status = 'queued' AND v.kind = r.kind
      AND p.tenant_id IN (SELECT tenant_id FROM decided WHERE n > 0)
    RETURNING r.*
),
events AS (
    INSERT INTO runs_event (run_id, seq, type, actor_type, actor_id, payload, created_at)
    SELECT id, last_event_seq, 'run.running', 'worker', %(worker)s::text,
           jsonb_build_object('from', 'queued', 'attempt', attempt), statement_timestamp()
    FROM claimed
)
SELECT {columns} FROM claimed
"""


def claim(
    *,
    worker_id: UUID,
    queues: list[str],
    kinds: dict[str, int],
    n: int,
    lease: float,
    returned: dict[UUID, int] | None = None,
) -> list[ClaimedRun]:
    """Claim up to ``n`` runnable runs of ``kinds`` (name → version) in ``queues``. One statement.

    ``returned`` gives back tenant slots of runs that left running without
    giving theirs back (``leave_running(give_slot=False)``); they are given
    back by this statement whatever it claims.
    """
    returned = returned or {}
    if n <= 0 and not returned or not kinds or not queues:
        return []
    # One queue (the usual case) compares with =, so the index scan returns
    # rows already in claim order; several queues use = ANY. Paused queues
    # drop out in an InitPlan evaluated once per claim.
    if len(queues) == 1:
        queue_filter = (
            "r.queue = (SELECT %(queue)s::text WHERE NOT EXISTS"
            " (SELECT 1 FROM runs_queue q WHERE q.name = %(queue)s AND q.paused))"
        )
    else:
        queue_filter = (
            "r.queue = ANY(ARRAY(SELECT unnest(%(queues)s::text[])"
            " EXCEPT SELECT q.name FROM runs_queue q WHERE q.paused))"
        )
    sql = _CLAIM_SQL.format(queue_filter=queue_filter, columns=_CLAIM_COLUMNS)
    names = list(kinds)
    params = {
        "queue": queues[0],
        "queues": list(queues),
        "kinds": names,
        "versions": [kinds[k] for k in names],
        "n": n,
        "worker": worker_id,
        "lease": lease,
        "ret_tenants": list(returned),
        "ret_counts": list(returned.values()),
    }
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [ClaimedRun(*row[:4], loads(row[4]), *row[5:]) for row in rows]


_HEARTBEAT_SQL = """
WITH held AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(tokens)s::bigint[]) AS h(id, token)
),
extended AS (
    UPDATE runs_run r SET
        locked_until = statement_timestamp() + make_interval(secs => %(lease)s),
        heartbeat_at = statement_timestamp()
    FROM held h
    WHERE r.id = h.id AND r.lease_token = h.token AND r.status = 'running'
    RETURNING r.id, r.cancel_requested_at IS NOT NULL, r.pause_requested_at IS NOT NULL
),
seen AS (
    UPDATE runs_worker SET last_seen_at = statement_timestamp(), runs_held = (SELECT count(*) FROM extended)
    WHERE id = %(worker)s
)
SELECT * FROM extended
"""


def heartbeat(*, worker_id: UUID, held: dict[UUID, int], lease: float) -> dict[UUID, tuple[bool, bool]]:
    """Extend the lease of every run held, in one statement; also marks the Worker row seen.

    Returns the runs still held with their (cancel, pause) request flags; a
    run missing from the answer has lost its lease.
    """
    ids = list(held)
    with connection.cursor() as cursor:
        cursor.execute(
            _HEARTBEAT_SQL,
            {"ids": ids, "tokens": [held[i] for i in ids], "lease": lease, "worker": worker_id},
        )
        return {row[0]: (row[1], row[2]) for row in cursor.fetchall()}


# The one exit from running (DESIGN.md §5). Every path out of `running`
# (finish, fail, retry, park, graceful release, lease rescue by the reaper)
# runs this statement, which clears the lease, gives the tenant slot back,
# adds the running time, writes the Event, and honours a cancel or pause
# request that landed meanwhile: a run being parked is cancelled or paused
# instead. A retry that would spend the last attempt fails the run.
_EXIT_SQL = """
WITH cur AS (
    SELECT id, tenant_id, claimed_at, heartbeat_at,
        CASE
            WHEN %(target)s NOT IN ('done', 'failed', 'cancelled') AND cancel_requested_at IS NOT NULL
                THEN 'cancelled'
            WHEN %(target)s = 'queued' AND failures + %(add_failure)s >= max_attempts
                THEN 'failed'
            WHEN %(target)s = 'queued' AND pause_requested_at IS NOT NULL
                THEN 'paused'
            -- Parking to wait for a message re-checks for one under the row
            -- lock: a message that arrived meanwhile is not missed.
            WHEN %(target)s = 'waiting' AND %(wake_on_message)s AND EXISTS (
                SELECT 1 FROM runs_message m WHERE m.run_id = runs_run.id AND m.consumed_by_step_id IS NULL)
                THEN 'queued'
            ELSE %(target)s
        END AS new_status
    FROM runs_run
    WHERE id = %(run)s AND status = 'running' AND lease_token = %(token)s
      {reaper_guard}
    FOR UPDATE
),
r AS (
    UPDATE runs_run SET
        status = cur.new_status,
        lease_token = NULL, locked_by = NULL, locked_until = NULL,
        running_seconds = running_seconds + GREATEST(0, EXTRACT(EPOCH FROM
            ({running_until}) - cur.claimed_at)),
        failures = runs_run.failures + %(add_failure)s,
        run_after = CASE WHEN cur.new_status = 'queued'
                         THEN statement_timestamp() + make_interval(secs => %(delay)s) ELSE runs_run.run_after END,
        result = CASE WHEN cur.new_status = 'done' THEN %(result)s::jsonb ELSE runs_run.result END,
        error = CASE WHEN %(error)s::text IS NOT NULL THEN %(error)s::text ELSE runs_run.error END,
        error_kind = CASE
            WHEN cur.new_status = 'failed' AND %(target)s = 'queued' THEN 'retryable'
            WHEN cur.new_status = 'failed' THEN COALESCE(%(error_kind)s, 'fatal')
            WHEN cur.new_status = 'done' THEN ''
            ELSE COALESCE(%(error_kind)s, runs_run.error_kind) END,
        expires_at = CASE WHEN cur.new_status IN ('waiting_human', 'waiting', 'paused')
                          THEN statement_timestamp() + make_interval(secs => %(expires)s)
                          ELSE runs_run.expires_at END,
        finished_at = CASE WHEN cur.new_status IN ('done', 'failed', 'cancelled') THEN statement_timestamp() END,
        current_step = CASE WHEN cur.new_status = 'done' THEN '' ELSE runs_run.current_step END,
        updated_at = statement_timestamp(),
        last_event_seq = runs_run.last_event_seq + 1
    FROM cur
    WHERE runs_run.id = cur.id
    RETURNING runs_run.id, runs_run.tenant_id, runs_run.status, runs_run.last_event_seq,
              runs_run.error_kind, runs_run.queue
),
t AS (
    UPDATE runs_tenant SET running = CASE WHEN %(give_slot)s THEN GREATEST(running - 1, 0) ELSE running END,
                           queued = queued + (r.status = 'queued')::int
    FROM r WHERE runs_tenant.id = r.tenant_id AND (%(give_slot)s OR r.status = 'queued')
),
e AS (
    INSERT INTO runs_event (run_id, seq, type, actor_type, actor_id, payload, created_at)
    SELECT r.id, r.last_event_seq, 'run.' || r.status, %(actor_type)s, %(actor_id)s,
           jsonb_build_object('from', 'running', 'reason', %(reason)s::text,
                              'error_kind', NULLIF(r.error_kind, ''), 'error', left(%(error)s::text, 500)),
           statement_timestamp()
    FROM r
)
SELECT status, queue FROM r
"""


def leave_running(
    *,
    run_id: UUID,
    token: int,
    target: str,
    reason: str,
    actor_type: str = "worker",
    actor_id: str = "",
    result_json: str | None = None,
    error: str | None = None,
    error_kind: str | None = None,
    add_failure: bool = False,
    delay_seconds: float = 0.0,
    only_if_expired: bool = False,
    expires_seconds: float | None = None,
    wake_on_message: bool = False,
    give_slot: bool = True,
) -> tuple[str, str] | None:
    """Move a run out of ``running`` towards ``target``; see the comment above _EXIT_SQL.

    Returns (the status actually reached, the run's queue), or None when the
    guard did not match (the lease is not ``token``'s any more, or with
    ``only_if_expired`` the lease has not expired): then nothing changed.
    With ``give_slot=False`` the tenant slot stays counted: the caller (a
    worker) gives it back with its next claim (``claim(returned=...)``).
    """
    sql = _EXIT_SQL.format(
        reaper_guard="AND locked_until < statement_timestamp()" if only_if_expired else "",
        # A rescued run was last alive at its last heartbeat, not now.
        running_until="cur.heartbeat_at" if only_if_expired else "statement_timestamp()",
    )
    params = {
        "run": run_id,
        "token": token,
        "target": target,
        "add_failure": 1 if add_failure else 0,
        "delay": delay_seconds,
        "result": result_json,
        "error": error,
        "error_kind": error_kind,
        "actor_type": actor_type,
        "actor_id": actor_id,
        "reason": reason,
        "expires": settings.RUNS_EXPIRES_SECONDS if expires_seconds is None else expires_seconds,
        "wake_on_message": wake_on_message,
        "give_slot": give_slot,
    }
    if not wake_on_message:
        return _fetch_exit(sql, params)
    # The message check must see a message committed while we waited for the
    # row (post_message holds it): take the lock first, then decide in a
    # statement with a fresh snapshot.
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM runs_run WHERE id = %s FOR UPDATE", [run_id])
        return _fetch_exit(sql, params)


def _fetch_exit(sql: str, params: dict[str, Any]) -> tuple[str, str] | None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else (row[0], row[1])


def notify_queues(queues: set[str] | list[str]) -> None:
    """Wake idle workers listening for these queues (after the submit has committed)."""
    with connection.cursor() as cursor:
        for queue in sorted(queues):
            cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, queue])


NOTIFY_CHANNEL = "agent_runs"
