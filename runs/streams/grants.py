"""What an event stream was opened with, and whether it still holds: a stream dies with its credentials.

A stream is opened with an API key, a stream token (issued under a key, or
to a signed-in user) or the dashboard's session. Each becomes a ``Grant``:
the key, or the user and the tenant (and the session, when the stream was
opened with one). ``live`` says which of many grants still hold, in at
most three queries however many streams share them: the hub asks it every
``RUNS_STREAM_BACKSTOP_SECONDS`` for all its streams at once and ends the
streams whose grant is gone (a revoked key or one that lost ``runs:read``,
a user who left the tenant or was deactivated, a session that logged out
or expired).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from uuid import UUID

from django.conf import settings
from django.utils import timezone

from runs.db import release_connection
from runs.models import ApiKey, Membership

# Session engines whose sessions are rows this process can look up (a signed cookie has none to revoke).
_DATABASE_SESSIONS = (
    "django.contrib.sessions.backends.db",
    "django.contrib.sessions.backends.cached_db",
)


@dataclass(frozen=True)
class Grant:
    tenant_id: UUID
    key_id: int | None = None
    user_id: int | None = None
    session_key: str | None = (
        None  # only for a stream opened with the session itself, never in a token
    )


def live(grants: Iterable[Grant]) -> set[Grant]:
    """The grants that still hold, from one query per kind of credential (the ORM: call it on a thread)."""
    grants = set(grants)
    keys = {g.key_id for g in grants if g.key_id is not None}
    live_keys = (
        set(
            ApiKey.objects.filter(
                pk__in=keys, revoked_at__isnull=True, scopes__contains=[ApiKey.Scope.READ]
            ).values_list("pk", flat=True)
        )
        if keys
        else set()
    )
    members = {(g.user_id, g.tenant_id) for g in grants if g.user_id is not None}
    live_members = set()
    if members:
        live_members = (
            set(
                Membership.objects.filter(
                    user_id__in={user for user, _ in members},
                    tenant_id__in={tenant for _, tenant in members},
                    user__is_active=True,
                ).values_list("user_id", "tenant_id")
            )
            & members
        )
    sessions = {g.session_key for g in grants if g.session_key}
    live_sessions = sessions
    if sessions and settings.SESSION_ENGINE in _DATABASE_SESSIONS:
        from django.contrib.sessions.models import Session

        live_sessions = set(
            Session.objects.filter(
                session_key__in=sessions, expire_date__gt=timezone.now()
            ).values_list("session_key", flat=True)
        )
    return {
        g
        for g in grants
        if (g.key_id is not None or g.user_id is not None)
        and (g.key_id is None or g.key_id in live_keys)
        and (g.user_id is None or (g.user_id, g.tenant_id) in live_members)
        and (not g.session_key or g.session_key in live_sessions)
    }


def live_released(grants: Iterable[Grant]) -> set[Grant]:
    """``live``, then this thread's connection back to the pool (the hub calls it on any thread)."""
    try:
        return live(grants)
    finally:
        release_connection()
