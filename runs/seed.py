"""Demo data for `manage.py up`: a tenant, a user who can log in, and a fresh API key."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from django.db import transaction
from django.dispatch import Signal
from django.tasks import task_backends
from django.utils import timezone

from runs.keys import create_api_key
from runs.models import ApiKey, Membership
from runs.tasks import DurableTaskBackend, durable_aliases
from runs.tenants import ensure_tenant

DEMO_KEY_NAME = "demo (manage.py up)"

# Sent inside seed_demo's transaction with ``tenant=`` the demo tenant: a demo app adds its rows to it
# (the example CRM its leads), without the engine knowing the app.
demo_seeded = Signal()


@dataclass(frozen=True)
class Demo:
    tenant_slug: str
    username: str
    password: str
    api_key: str


@transaction.atomic
def seed_demo(*, slug: str = "demo", username: str = "demo", password: str = "demo") -> Demo:
    tenant, _ = ensure_tenant(slug=slug, name="Demo tenant", max_running=5)
    User = get_user_model()
    user = User.objects.filter(username=username).first()
    if user is None:
        user = User.objects.create_user(
            username=username, password=password, is_staff=True, is_superuser=True
        )
    Membership.objects.update_or_create(
        user=user, tenant=tenant, defaults={"role": Membership.Role.APPROVER}
    )
    # Django tasks run in their backend's tenant (runs.tasks): the demo user sees them on the dashboard too.
    for alias in durable_aliases():
        backend = task_backends[alias]
        assert isinstance(backend, DurableTaskBackend)  # what durable_aliases lists
        Membership.objects.update_or_create(
            user=user, tenant=backend.tenant(), defaults={"role": Membership.Role.APPROVER}
        )
    demo_seeded.send(sender=Demo, tenant=tenant)
    # The secret of an earlier key cannot be shown again: issue a new one
    # and revoke the previous demo keys.
    ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    issued = create_api_key(tenant=tenant, name=DEMO_KEY_NAME)
    return Demo(
        tenant_slug=tenant.slug, username=username, password=password, api_key=issued.secret
    )
