"""Retention (docs/how-to/retention.md): finished runs past their time are deleted with everything they own.

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
and three events; bench/retention.py). The statement is in ``runs/sql/retention.sql``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import connection, transaction

from runs.queries import queries, single

logger = logging.getLogger(__name__)


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
            queries.prune_finished,
            {"before": before, "age": age, "give_up": give_up, "batch": batch},
        )
        row = single(cursor)
    pruned = PruneBatch(**row | {"files": list(row["files"])})
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
