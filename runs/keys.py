"""API keys: ``ak_<prefix>_<secret>``; only the prefix and the SHA-256 of the whole key are stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from runs.models import ApiKey, Tenant

ALL_SCOPES = [scope.value for scope in ApiKey.Scope]
LAST_USED_RESOLUTION = timedelta(minutes=1)


def hash_key(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    secret: str  # shown once, never stored


def create_api_key(*, tenant: Tenant, name: str, scopes: list[str] | None = None) -> IssuedKey:
    scopes = list(ALL_SCOPES if scopes is None else scopes)
    unknown = sorted(set(scopes) - set(ALL_SCOPES))
    if unknown:
        raise ValueError(f"unknown scopes {unknown}; choose from {ALL_SCOPES}")
    prefix = secrets.token_hex(4)
    raw = f"ak_{prefix}_{secrets.token_urlsafe(32)}"
    api_key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, secret_sha256=hash_key(raw), scopes=scopes
    )
    return IssuedKey(api_key=api_key, secret=raw)


def authenticate_key(raw: str) -> ApiKey | None:
    """The live key for this secret (with its tenant), or None; notes its use at most once a minute."""
    # Every key is ASCII: anything else (a lone surrogate cannot even be hashed) is no key of ours.
    if not raw or len(raw) > 200 or not raw.isascii():
        return None
    api_key = (
        ApiKey.objects.select_related("tenant")
        .filter(secret_sha256=hash_key(raw), revoked_at__isnull=True)
        .first()
    )
    if api_key is None:
        return None
    now = timezone.now()
    if api_key.last_used_at is None or now - api_key.last_used_at >= LAST_USED_RESOLUTION:
        ApiKey.objects.filter(pk=api_key.pk).update(last_used_at=now)
        api_key.last_used_at = now
    return api_key
