from __future__ import annotations

from runs.models import Tenant


def ensure_tenant(
    *,
    slug: str,
    name: str | None = None,
    max_running: int | None = None,
    max_queued: int | None = None,
    weight: int | None = None,
) -> tuple[Tenant, bool]:
    """Create the tenant, or update the given fields of an existing one.

    A value out of range is a ValueError before anything is written.
    """
    for field, value, least in (
        ("max_running", max_running, 0),
        ("max_queued", max_queued, 0),
        ("weight", weight, 1),
    ):
        if value is not None and value < least:
            raise ValueError(
                f"a tenant's {field} is a whole number of at least {least}, not {value}"
            )
    defaults = {"name": name or slug}
    tenant, created = Tenant.objects.get_or_create(slug=slug, defaults=defaults)
    changed = []
    if name is not None and tenant.name != name:
        tenant.name = name
        changed.append("name")
    if max_running is not None and tenant.max_running != max_running:
        tenant.max_running = max_running
        changed.append("max_running")
    if max_queued is not None and tenant.max_queued != max_queued:
        tenant.max_queued = max_queued
        changed.append("max_queued")
    if weight is not None and tenant.weight != weight:
        tenant.weight = weight
        changed.append("weight")
    if changed:
        tenant.save(update_fields=changed)
    return tenant, created
