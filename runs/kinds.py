"""Which kinds a tenant may start: the one check behind every door a tenant starts a run through.

A tenant (an API key, or a member on the dashboard) may start a kind that is
registered, public (``@agent(..., public=False)`` is not; a Django ``@task``
kind never is, nor an engine kind) and, when an operator narrowed the tenant
to a list (``Tenant.allowed_kinds``: the admin, ``manage.py allowkinds``),
on that list. ``POST /api/runs``, ``POST /api/runs/{id}/fork`` and the
dashboard's New run form ask here; ``GET /api/kinds`` and the form list
``startable_kinds``. Code is not a tenant: ``submit_run``, ``ctx.spawn`` and
Django's task API start any registered kind.

A kind a tenant may not start is refused exactly as an unknown one is, so a
tenant learns nothing about the kinds kept from it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runs.exceptions import UnknownKind
from runs.registry import AgentKind, all_kinds, get_kind

if TYPE_CHECKING:
    from runs.models import Tenant


def unknown_kind(name: str) -> UnknownKind:
    """The error for a kind that is not registered, or that the caller may not start (the same words)."""
    return UnknownKind(f"unknown kind {name!r}; GET /api/kinds lists the kinds you may start")


def may_start(tenant: Tenant, kind: AgentKind) -> bool:
    allowed = tenant.allowed_kinds
    return kind.public and (allowed is None or kind.name in allowed)


def startable_kinds(tenant: Tenant) -> list[AgentKind]:
    """The kinds ``tenant`` may start, by name."""
    return [kind for kind in all_kinds() if may_start(tenant, kind)]


def startable_kind(tenant: Tenant, name: str) -> AgentKind | None:
    kind = get_kind(name) if isinstance(name, str) else None
    return kind if kind is not None and may_start(tenant, kind) else None


def require_startable(tenant: Tenant, name: str) -> AgentKind:
    """The kind ``name`` if ``tenant`` may start it; else ``UnknownKind``, as for a kind nobody registered."""
    kind = startable_kind(tenant, name)
    if kind is None:
        raise unknown_kind(name)
    return kind


def public_kind_names() -> list[str]:
    """What an operator may put on a tenant's list."""
    return [kind.name for kind in all_kinds() if kind.public]


class NotStartable(ValueError):
    """An allow-list names a kind no tenant can start (unknown, a task kind, public=False)."""


def allowable(names: list[str] | None) -> list[str] | None:
    """``names`` once each, in order, if every one is a public kind registered here; else ``NotStartable``.

    A typo, or a task kind the list could never open, is refused rather than kept.
    """
    if names is None:
        return None
    names = list(dict.fromkeys(names))
    public = public_kind_names()
    refused = [name for name in names if name not in public]
    if refused:
        raise NotStartable(
            f"not a kind a tenant can start: {', '.join(refused)} (kinds: {', '.join(public) or 'none'})"
        )
    return names


def set_allowed_kinds(tenant: Tenant, names: list[str] | None) -> Tenant:
    """Narrow ``tenant`` to ``names`` (see ``allowable``), or lift its list with ``None``."""
    names = allowable(names)
    if tenant.allowed_kinds != names:
        tenant.allowed_kinds = names
        tenant.save(update_fields=["allowed_kinds"])
    return tenant
