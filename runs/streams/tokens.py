"""Stream tokens: a signed, short-lived pass to one run's event stream, for browsers' ``EventSource``.

``EventSource`` cannot send an ``Authorization`` header, and an API key in a
URL ends up in access logs and browser history, so a client with a key
asks ``POST /api/runs/{id}/stream-token`` for one of these and puts it in
the stream's URL (``?token=``). It names the run, its tenant and the
credential it was issued under (the API key, or the signed-in user), is
signed with ``SECRET_KEY`` and is accepted for ``RUNS_STREAM_TOKEN_SECONDS``
(60) after it was issued, to open (or reopen) that run's stream only, and
only while that credential holds (runs.streams.grants): a token dies with
its key.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.core import signing
from django.utils import timezone

from runs.streams.grants import Grant

SALT = "runs.streams.token"


class InvalidToken(Exception):
    """The token is not good for this stream; ``str()`` says why."""


def issue(*, run_id: UUID, grant: Grant) -> tuple[str, datetime]:
    """A token for the run's stream under ``grant`` (a key's or a user's), and when it stops being accepted."""
    claims: dict = {"run": str(run_id), "tenant": str(grant.tenant_id)}
    if grant.key_id is not None:
        claims["key"] = grant.key_id
    elif grant.user_id is not None:
        claims["user"] = grant.user_id
    else:
        raise ValueError("a stream token is issued under an API key or to a user")
    token = signing.dumps(claims, salt=SALT)
    return token, timezone.now() + timedelta(seconds=settings.RUNS_STREAM_TOKEN_SECONDS)


def check(token: str, *, run_id: UUID) -> Grant:
    """The credential the token was issued under, if the token is good for ``run_id``'s stream now.

    The caller still checks that the credential holds (``grants.live``): the signature cannot know.
    """
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
    key, user = claims.get("key"), claims.get("user")
    # A token without its credential (issued before tokens named one) is not accepted: it could not be revoked.
    if not (isinstance(key, int) or isinstance(user, int)):
        raise InvalidToken("the stream token is not valid: ask for a new one")
    try:
        tenant_id = UUID(claims["tenant"])
    except (KeyError, ValueError, TypeError):
        raise InvalidToken("the stream token is not valid") from None
    return Grant(
        tenant_id=tenant_id,
        key_id=key if isinstance(key, int) else None,
        user_id=user if isinstance(user, int) and not isinstance(key, int) else None,
    )
