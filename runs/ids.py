"""Run ids: UUIDv7 (RFC 9562), time-ordered, so that ids sort in the order runs were submitted.

The claim breaks its last tie (equal priority and ``run_after``, as for runs
submitted in one transaction, which share the transaction's ``now()``) by
id, on its index: with time-ordered ids that is submission order, at no
cost to the claim and without a column of its own on the hot table. New
rows also land at the right-hand edge of the primary-key index instead of
on a random page of it.

``uuid_utils`` (Rust's ``uuid`` crate) makes them: within one process each
id is greater than the one before, also within one millisecond (a counter
in the bits after the timestamp) and across threads; ids of two processes
in the same millisecond differ in their random bits (74 of them). Ids made
before this (UUIDv4) stay valid: nothing reads a version out of an id.
"""

from __future__ import annotations

import uuid

from uuid_utils.compat import uuid7


def new_run_id() -> uuid.UUID:
    """A new run's id (``Run.id``'s default): greater than every id this process made before."""
    return uuid7()
