"""The engine's transitions of a run, each one fenced statement (docs/architecture.md).

- ``claim``: queued → running (the claim, the heartbeat, adopting a claim
  whose answer was lost);
- ``steps`` and ``steplog``: what a running run records of its steps (write-ahead, announce,
  checkpoint, failure, a pending approval) and reads back (the step log);
- ``exit``: the one exit from running (finish, fail, retry, park, release,
  rescue);
- ``reaping``: rescue of expired leases, deadlines, expiry of waiting runs,
  the tenant counters;
- ``family``, ``timers``, ``marks``, ``saga``: parents and children, durable
  time, what a step records before it ends, a saga's rollback;
- ``retention``: deleting finished runs past their time;
- ``fleet``: the Worker rows.

Raw SQL on purpose: each is a single statement (data-modifying CTEs), so
that a claim, a checkpoint and an exit are each one round trip and one
atomic change, fenced on the run's lease token. Times are the database's
``statement_timestamp()``, never an app server's clock. The ORM cannot say
``FOR UPDATE SKIP LOCKED`` inside a LATERAL join, nor write three tables in
one statement. Every statement runs in autocommit on the calling thread's
Django connection, which the caller hands back to the pool
(``runs.db.release_connection``). Events go through the outbox
(``runs.events``).

Each statement has a name and its whole text, with the comments that say
why, in ``runs/sql/<module>.sql`` (``claim.sql``, ``family.sql``...), read by
``runs.queries``: a module executes ``queries.<name>`` and reads its rows by
column name. (``exit`` and ``steps`` still assemble theirs in Python.)
"""
