"""Tenants' webhook signing secrets and Standard Webhooks signatures.

A secret is ``whsec_`` and 24 random bytes in base64, made the first time
it is needed. Rotating makes a new one current and keeps the old one
signing too for 24 hours, so a receiver can switch secrets at its own
pace: each delivery carries one ``v1,`` signature per live secret, and a
receiver that knows either accepts it.
"""

from __future__ import annotations

import base64
import secrets
from datetime import datetime, timedelta
from uuid import UUID

from django.db import transaction
from django.db.models.functions import Now
from standardwebhooks.webhooks import Webhook

from runs.models import Tenant

ROTATION_OVERLAP = timedelta(hours=24)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def current_secret(tenant_id: UUID) -> str:
    """The tenant's current secret, made now if it has none (two callers racing agree on one)."""
    Tenant.objects.filter(pk=tenant_id, webhook_secret="").update(webhook_secret=new_secret())
    return Tenant.objects.values_list("webhook_secret", flat=True).get(pk=tenant_id)


@transaction.atomic
def rotate(tenant_id: UUID) -> str:
    """A new current secret; the one it replaces keeps signing for ``ROTATION_OVERLAP``."""
    tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
    secret = new_secret()
    Tenant.objects.filter(pk=tenant.pk).update(
        webhook_secret=secret,
        webhook_secret_previous=tenant.webhook_secret,
        webhook_secret_previous_until=Now() + ROTATION_OVERLAP if tenant.webhook_secret else None,
    )
    return secret


def signature(*, secrets_: list[str], webhook_id: str, timestamp: datetime, body: str) -> str:
    """The ``webhook-signature`` header: one ``v1,<base64>`` per secret, space-separated."""
    return " ".join(Webhook(secret).sign(webhook_id, timestamp, body) for secret in secrets_)
