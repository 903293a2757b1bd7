"""Reads from a replica (``DATABASE_REPLICA_URL``): people's pages and the API's reads, never the engine's.

With a replica configured, a GET or HEAD request to the dashboard, the
admin or the API reads from it (``ReplicaReads``, a middleware, marks the
request; ``ReplicaRouter`` sends the ORM's reads there while it is marked).
Everything else reads and writes the primary: workers, the reaper, the
webhook sender, every write and every request that writes, the event
streams (they follow NOTIFYs the primary sends, and a replica may not have
replayed the Event yet), the health check and the metrics.

Read-your-writes, where a person would notice: a request that wrote
(anything but GET, HEAD, OPTIONS, answered below 400) leaves a signed
cookie with the primary's WAL position after it; while the replica has not
replayed that far, that browser's reads go to the primary, so a run page
right after a submit or an approval shows them. A client without cookies
(the API with a key) may read a list a moment behind; a read that answers
404 from the replica is answered again from the primary, so a run fetched
right after its submit is found.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from django.conf import settings
from django.core import signing
from django.db import DatabaseError, connections

logger = logging.getLogger(__name__)

REPLICA = "replica"
COOKIE = "agentruns_wrote"  # the primary's WAL position after this browser's last write
COOKIE_SECONDS = 300  # a replica further behind than this is not one to read from anyway
_SALT = "config.replicas.wrote"
_SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
_PRIMARY_ONLY = ("/api/health", "/metrics")

_reads_from: ContextVar[str | None] = ContextVar("reads_from", default=None)


class ReplicaRouter:
    """The ORM's reads go to the replica while a request marked for it runs; writes never do."""

    def db_for_read(self, model, **hints):
        return _reads_from.get()

    def db_for_write(self, model, **hints):
        return None

    def allow_relation(self, obj1, obj2, **hints):
        return True  # the replica is a copy of the primary: its rows are the primary's

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        return db != REPLICA


def _streams(request) -> bool:
    return "text/event-stream" in request.headers.get("Accept", "") or request.path.endswith(
        "/events"
    )


def _lsn(alias: str, query: str) -> int | None:
    with connections[alias].cursor() as cursor:
        cursor.execute(f"SELECT ({query}) - '0/0'::pg_lsn")
        [value] = cursor.fetchone()
    return None if value is None else int(value)


class ReplicaReads:
    """Marks a person's or a client's read for the replica, unless its browser wrote what the replica lacks."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method not in _SAFE:
            response = self.get_response(request)
            if response.status_code < 400:
                self._remember_write(response)
            return response
        if request.path.startswith(_PRIMARY_ONLY) or _streams(request) or self._behind(request):
            return self.get_response(request)
        token = _reads_from.set(REPLICA)
        try:
            response = self.get_response(request)
        finally:
            _reads_from.reset(token)
        if response.status_code == 404 or response.status_code >= 500:
            # Perhaps not replayed yet (a run fetched right after its submit), or the replica is
            # down: the primary answers.
            return self.get_response(request)
        return response

    def _behind(self, request) -> bool:
        """Whether this browser wrote something the replica has not replayed yet (or the replica is down)."""
        wrote = request.COOKIES.get(COOKIE)
        if not wrote:
            return False
        try:
            position = int(signing.loads(wrote, salt=_SALT, max_age=COOKIE_SECONDS))
        except (signing.BadSignature, ValueError, TypeError):
            return False
        try:
            replayed = _lsn(REPLICA, "SELECT pg_last_wal_replay_lsn()")
        except DatabaseError:
            logger.warning("the replica cannot be read; reading from the primary", exc_info=True)
            return True
        # NULL: not a standby (a replica URL naming a primary is always caught up).
        return replayed is not None and replayed < position

    def _remember_write(self, response) -> None:
        try:
            position = _lsn("default", "SELECT pg_current_wal_lsn()")
        except DatabaseError:
            return
        response.set_cookie(
            COOKIE,
            signing.dumps(position, salt=_SALT),
            max_age=COOKIE_SECONDS,
            httponly=True,
            samesite="Lax",
            secure=settings.SESSION_COOKIE_SECURE,
        )
