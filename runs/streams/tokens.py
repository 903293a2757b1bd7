"""Stream tokens: a signed, short-lived pass to one run's event stream, for browsers' ``EventSource``.

``EventSource`` cannot send an ``Authorization`` header, and an API key in a
URL ends up in access logs and browser history, so a client with a key
asks ``POST /api/runs/{id}/stream-token`` for one of these and puts it in
the stream's URL (``?token=``). It names the run and its tenant, is signed
with ``SECRET_KEY`` and is accepted for ``RUNS_STREAM_TOKEN_SECONDS``
(60) after it was issued, to open (or reopen) that run's stream only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.core import signing
from django.utils import timezone

SALT = "runs.streams.token"


class InvalidToken(Exception):
    """The token is not good for this stream; ``str()`` says why."""


def issue(*, run_id: UUID, tenant_id: UUID) -> tuple[str, datetime]:
    """A token for the run's stream, and when it stops being accepted."""
    token = signing.dumps({"run": str(run_id), "tenant": str(tenant_id)}, salt=SALT)
    return token, timezone.now() + timedelta(seconds=settings.RUNS_STREAM_TOKEN_SECONDS)


def check(token: str, *, run_id: UUID) -> UUID:
    """The tenant the token was issued in, if it is good for ``run_id``'s stream now."""
    try:
        claims = signing.loads(token, salt=SALT, max_age=settings.RUNS_STREAM_TOKEN_SECONDS)
    except signing.SignatureExpired:
        raise InvalidToken(
            f"the stream token has expired (tokens last {settings.RUNS_STREAM_TOKEN_SECONDS} s): ask for a new one"
        ) from None
    except signing.BadSignature:
        raise InvalidToken("the stream token is not valid") from None
    if not isinstance(claims, dict) or claims.get("run") != str(run_id):
        raise InvalidToken("the stream token is for another run")
    try:
        return UUID(claims["tenant"])
    except (KeyError, ValueError):
        raise InvalidToken("the stream token is not valid") from None
