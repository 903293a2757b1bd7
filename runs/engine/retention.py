"""Retention (README.md, "Retention"): finished runs past their time are deleted with everything they own.

One batch is one statement, so one short transaction: it picks the oldest
finished runs on ``run_finished_idx`` (``FOR UPDATE SKIP LOCKED``, so a run
a person is retrying or forking right now is left to a later batch), then
deletes their steps, step attempts, events, messages, artifacts, webhook
deliveries and stream watches, and the runs. The database's foreign keys
are plain deferred constraints (Django emulates ``on_delete``), so the
statement does by hand what ``on_delete`` would: a surviving fork's
``origin_id`` is set to NULL with its origin's deletion, and a run is only
taken once it has no child runs left (leaves first: a parent goes in a
later batch, after its children), so no constraint is left pointing at a
deleted row when the transaction commits.

Nothing live is deleted: a run must be terminal and finished before the
cutoff, and so must its parent, if it has one (a live parent may still read
its children's results); a run with a webhook delivery still being retried
waits for it. The artifacts' files go from storage after the rows' commit.

Most of a batch's time is spent at its commit, in PostgreSQL's checks of
those deferred constraints: each deleted run, step and event is looked up in
every table that references it (about 14 index probes for a run with a step
and three events; bench/retention.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import connection, transaction

from runs.db import sql
from runs.models.notifications import LIVE_DELIVERY_STATUSES

logger = logging.getLogger(__name__)

# The cutoff on the database's clock (an age), or a time the caller names.
_CUTOFF = "COALESCE(%(before)s::timestamptz, statement_timestamp() - make_interval(secs => %(age)s::float8))"

_PRUNE_SQL = sql(
    """
WITH doomed AS (
    -- Oldest first on run_finished_idx; finished_at IS NOT NULL spelt out so the partial index applies.
    SELECT r.id FROM runs_run r
    WHERE r.finished_at IS NOT NULL AND r.finished_at < {cutoff} AND r.status IN {terminal}
      -- Leaves first (run_parent_idx): a parent waits until its children are gone.
      AND NOT EXISTS (SELECT 1 FROM runs_run c WHERE c.parent_id = r.id)
      -- A child goes only with a parent that is itself past retention (a live one may still read it).
      -- A scalar subquery, one primary-key lookup per child: as an EXISTS under OR, PostgreSQL may
      -- hash every finished run of the table instead.
      AND (r.parent_id IS NULL OR (
          SELECT p.status IN {terminal} AND p.finished_at < {cutoff} FROM runs_run p WHERE p.id = r.parent_id))
      -- A webhook delivery still within its retry window is the delivery loop's work.
      AND NOT EXISTS (
          SELECT 1 FROM runs_webhookdelivery d
          WHERE d.run_id = r.id AND d.status IN {live_deliveries}
            AND d.created_at > statement_timestamp() - make_interval(secs => %(give_up)s::float8))
    ORDER BY r.finished_at
    LIMIT %(batch)s
    FOR UPDATE OF r SKIP LOCKED
),
-- ON DELETE SET NULL of runs_run.origin, which the database does not do. An array, so that
-- run_origin_idx is probed for these ids whatever the planner guesses of forks and of the batch.
-- The forks, which may be running, are waited for (their origin must go),
-- so they are locked in id order (runs.engine.steps.LOCK_IN_ORDER): a worker's
-- heartbeat over them would deadlock with this otherwise. The doomed runs
-- above are skipped when locked, never waited for: they need no order.
fork_rows AS (
    SELECT f.id FROM runs_run f
    WHERE f.origin_id = ANY (ARRAY(SELECT id FROM doomed)) AND f.id NOT IN (SELECT id FROM doomed)
    ORDER BY f.id
    FOR NO KEY UPDATE
),
forks AS (
    UPDATE runs_run f SET origin_id = NULL
    FROM fork_rows l
    WHERE f.id = l.id AND f.origin_id = ANY (ARRAY(SELECT id FROM doomed))
    RETURNING f.id
),
-- Every table below is read through an index that leads with run_id.
deliveries AS (DELETE FROM runs_webhookdelivery WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
attempts AS (DELETE FROM runs_stepattempt WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
messages AS (DELETE FROM runs_message WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
artifacts AS (DELETE FROM runs_artifact WHERE run_id IN (SELECT id FROM doomed) RETURNING file),
steps AS (DELETE FROM runs_step WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
events AS (DELETE FROM runs_event WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
watches AS (DELETE FROM runs_streamwatch WHERE run_id IN (SELECT id FROM doomed) RETURNING 1),
gone AS (DELETE FROM runs_run WHERE id IN (SELECT id FROM doomed) RETURNING 1)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM steps), (SELECT count(*) FROM attempts),
       (SELECT count(*) FROM events), (SELECT count(*) FROM messages), (SELECT count(*) FROM artifacts),
       (SELECT count(*) FROM deliveries), (SELECT count(*) FROM watches), (SELECT count(*) FROM forks),
       ARRAY(SELECT file FROM artifacts WHERE file <> '')
""",
    cutoff=_CUTOFF,
    live_deliveries="(" + ", ".join(f"'{s.value}'" for s in LIVE_DELIVERY_STATUSES) + ")",
)


@dataclass
class PruneBatch:
    """What one batch (or, added up, one pass) deleted."""

    runs: int = 0
    steps: int = 0
    attempts: int = 0
    events: int = 0
    messages: int = 0
    artifacts: int = 0
    deliveries: int = 0
    watches: int = 0
    forks_detached: int = 0  # surviving forks whose origin was deleted (origin now NULL)
    files: list[str] = field(default_factory=list)  # the artifacts' stored files

    def __add__(self, other: PruneBatch) -> PruneBatch:
        return PruneBatch(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def __str__(self) -> str:
        return " ".join(
            f"{f.name}={getattr(self, f.name)}" for f in fields(self) if f.name != "files"
        )


def prune_finished(
    *, older_than: timedelta | datetime, batch: int, webhook_give_up: timedelta | None = None
) -> PruneBatch:
    """Delete up to ``batch`` runs finished before ``older_than`` (an age, or a time) with all they own.

    One statement, so one transaction; the artifacts' files are deleted from
    storage once it has committed. A batch shorter than ``batch`` means no
    more runs are due now. ``webhook_give_up`` is how long a delivery is
    retried (``RUNS_WEBHOOK_GIVE_UP_SECONDS``): a run with a live delivery
    younger than that is kept.
    """
    before = older_than if isinstance(older_than, datetime) else None
    age = older_than.total_seconds() if isinstance(older_than, timedelta) else 0.0
    give_up = (
        webhook_give_up.total_seconds()
        if webhook_give_up is not None
        else settings.RUNS_WEBHOOK_GIVE_UP_SECONDS
    )
    with connection.cursor() as cursor:
        cursor.execute(
            _PRUNE_SQL, {"before": before, "age": age, "give_up": give_up, "batch": batch}
        )
        row = cursor.fetchone()
    pruned = PruneBatch(*row[:9], files=list(row[9]))
    if pruned.files:
        files = pruned.files
        # In autocommit (the reaper) at once; inside a transaction, once it commits.
        transaction.on_commit(lambda: delete_files(files))
    return pruned


def delete_files(names: list[str]) -> None:
    """Delete stored files; one already gone is fine, one that cannot be deleted is logged and left."""
    for name in names:
        try:
            default_storage.delete(name)
        except Exception:  # the rows are gone either way: an orphan file is the lesser harm
            logger.warning("could not delete artifact file %s", name, exc_info=True)
