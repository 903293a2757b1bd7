"""How a process's figures reach ``GET /metrics``: a ``MetricSnapshot`` row of its own, rewritten every few seconds.

Workers run on many hosts and come and go with every deploy; Prometheus
should not have to find each one. So every long-running process
(``runworker``, ``reap``, ``deliverwebhooks``, ``serve``) publishes its
registry (``runs.metrics.process``) to the database every
``RUNS_METRICS_PUBLISH_SECONDS`` and once more when it stops, and the web
process that answers a scrape sums all the rows (``runs.metrics.scrape``):
one scrape target, behind the same load balancer as the API. This is
prometheus_client's multiprocess mode with a table instead of files on one
host. A process killed with SIGKILL loses what it counted since its last
publication (at most one interval); nothing else is lost.

Rows of processes gone are kept, so that no counter goes down when a worker
restarts; the reaper folds those silent for ``RUNS_METRICS_RETIRE_SECONDS``
into the one ``MetricSnapshot.RETIRED`` row (``retire_silent``). A process
that was only silent, not gone, finds its row folded at its next
publication and carries on under a new row with what it counted since.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.db import DatabaseError, connection, transaction

from runs.db import dumps, loads, release_connection
from runs.metrics.process import series
from runs.models import MetricSnapshot
from runs.queries import queries, rows, single

logger = logging.getLogger(__name__)

# (family, type, labels, bucket bounds): a series, the same in every process that has it.
Key = tuple[str, str, tuple[tuple[str, str], ...], tuple[str, ...]]
Values = dict[Key, list[float]]


def keyed(rows: list[list]) -> Values:
    """Series rows (``runs.metrics.process.series``) by key, the values of equal keys summed."""
    out: Values = {}
    for family, kind, labels, bounds, values in rows:
        key = (family, kind, tuple(sorted(labels.items())), tuple(bounds))
        out[key] = plus(out[key], values) if key in out else list(values)
    return out


def plus(a: list[float], b: list[float], sign: float = 1.0) -> list[float]:
    return [x + sign * y for x, y in zip(a, b, strict=True)]


def minus(current: Values, earlier: Values) -> Values:
    return {k: plus(v, earlier[k], -1.0) if k in earlier else v for k, v in current.items()}


def summed(a: Values, b: Values) -> Values:
    return {
        k: plus(a[k], b[k]) if k in a and k in b else list(a.get(k) or b[k])
        for k in a.keys() | b.keys()
    }


def unkeyed(values: Values) -> list[list]:
    return [
        [family, kind, dict(labels), list(bounds), v]
        for (family, kind, labels, bounds), v in values.items()
    ]


class Publisher:
    """Writes this process's figures to its row; ``start()`` does it every ``interval`` seconds on a thread."""

    def __init__(self, *, role: str, interval: float | None = None):
        self.role = role
        self.interval = settings.RUNS_METRICS_PUBLISH_SECONDS if interval is None else interval
        self.process = uuid.uuid4()
        self._inserted = False
        self._published: Values = {}  # what the row holds now
        self._folded: Values = {}  # what earlier rows of this process hold (folded into RETIRED)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def publish(self) -> None:
        """Write what this process counted since it started (less what earlier rows of it hold)."""
        with self._lock:
            current = keyed(series())
            own = minus(current, self._folded)
            try:
                with connection.cursor() as cursor:
                    if self._inserted:
                        cursor.execute(
                            queries.update_snapshot,
                            {"samples": dumps(unkeyed(own)), "process": self.process},
                        )
                        if cursor.rowcount == 0:
                            # Folded into RETIRED while this process was silent: what the row
                            # held is counted there, so a new row carries the rest.
                            self._folded = summed(self._folded, self._published)
                            self.process, self._inserted = uuid.uuid4(), False
                            own = minus(current, self._folded)
                    if not self._inserted:
                        cursor.execute(
                            queries.insert_snapshot,
                            {
                                "process": self.process,
                                "role": self.role,
                                "host": socket.gethostname()[:255],
                                "pid": os.getpid(),
                                "samples": dumps(unkeyed(own)),
                            },
                        )
                        self._inserted = True
                self._published = own
            finally:
                release_connection()

    def start(self) -> Publisher:
        self._thread = threading.Thread(target=self._loop, name=f"metrics-{self.role}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and publish one last time."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._safely_publish()

    def _loop(self) -> None:
        while not self._stopping.wait(self.interval):
            self._safely_publish()

    def _safely_publish(self) -> None:
        try:
            self.publish()
        except DatabaseError as exc:  # the database is away: the next one carries the figures
            logger.warning("could not publish metrics: %s", exc)


@contextmanager
def publishing(*, role: str) -> Iterator[Publisher]:
    """Publish this process's figures while the block runs, and once more at its end."""
    publisher = Publisher(role=role).start()
    try:
        yield publisher
    finally:
        publisher.stop()


def retire_silent(*, silent_seconds: float | None = None, batch: int = 500) -> int:
    """Fold the rows of processes silent for ``silent_seconds`` into the RETIRED row; returns how many."""
    silent = settings.RUNS_METRICS_RETIRE_SECONDS if silent_seconds is None else silent_seconds
    with transaction.atomic(), connection.cursor() as cursor:
        retired = {"retired": MetricSnapshot.RETIRED}
        cursor.execute(queries.silent_snapshots, retired | {"silent": silent, "batch": batch})
        silent_rows = rows(cursor)
        if not silent_rows:
            return 0
        cursor.execute(queries.insert_retired_snapshot, retired)
        cursor.execute(queries.lock_retired_snapshot, retired)
        total = keyed(loads(single(cursor)["samples"]))
        for row in silent_rows:
            total = summed(total, keyed(loads(row["samples"])))
        cursor.execute(
            queries.update_snapshot,
            {"samples": dumps(unkeyed(total)), "process": MetricSnapshot.RETIRED},
        )
        cursor.execute(
            queries.delete_snapshots, {"processes": [row["process"] for row in silent_rows]}
        )
    return len(silent_rows)
