"""Who may do what on the dashboard: the selected tenant and the user's role in it.

Roles: a viewer reads; an operator also submits, cancels,
pauses, resumes, retries and messages; an approver also approves, rejects and
resolves. Being staff grants nothing by itself: a staff member may also take
the actions whose operations-console permission they hold (the ones
``runs/admin`` checks, ``Run.Meta.permissions``), and a superuser may do
everything, always in the tenants they belong to. Views check with
``require`` (403 otherwise); templates only hide what the server refuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from django.contrib.auth.models import AbstractUser, AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from runs.actors import person_name
from runs.models import Membership, Tenant

# The session key holding the id of the tenant the user selected.
SESSION_TENANT = "dashboard_tenant_id"


class Action(StrEnum):
    SUBMIT = "submit"
    CANCEL = "cancel"
    PAUSE = "pause"
    RESUME = "resume"
    RETRY = "retry"
    MESSAGE = "message"
    APPROVE = "approve"
    REJECT = "reject"
    RESOLVE = "resolve"


OPERATOR_ACTIONS = frozenset(
    {Action.SUBMIT, Action.CANCEL, Action.PAUSE, Action.RESUME, Action.RETRY, Action.MESSAGE}
)
APPROVER_ACTIONS = OPERATOR_ACTIONS | {Action.APPROVE, Action.REJECT, Action.RESOLVE}
ROLE_ACTIONS: dict[str, frozenset[Action]] = {
    Membership.Role.VIEWER: frozenset(),
    Membership.Role.OPERATOR: OPERATOR_ACTIONS,
    Membership.Role.APPROVER: APPROVER_ACTIONS,
}
# What the operations console asks of staff for the same actions (runs/admin/run.py).
ACTION_PERMISSIONS = {
    Action.CANCEL: "runs.cancel_run",
    Action.RETRY: "runs.retry_run",
    Action.APPROVE: "runs.approve_run",
    Action.REJECT: "runs.approve_run",
    Action.RESOLVE: "runs.resolve_run",
}


class NoMembership(PermissionDenied):
    """A signed-in user who is a member of no tenant: a 403, since nothing is hidden from them, only not theirs.

    Raised before any run is looked up, so it tells nothing about which runs
    exist. ``templates/no_membership.html`` is its page.
    """


@dataclass(frozen=True)
class Access:
    """The tenant a request acts in, the user's role there, and the other tenants they may switch to."""

    tenant: Tenant
    role: str
    user: AbstractUser
    memberships: tuple[Membership, ...]

    def can(self, action: Action) -> bool:
        if action in ROLE_ACTIONS.get(self.role, frozenset()) or self.user.is_superuser:
            return True
        # Only past the role: the permission lookup (two queries, then cached on the user) is for staff.
        permission = ACTION_PERMISSIONS.get(action)
        return permission is not None and self.user.is_staff and self.user.has_perm(permission)

    @property
    def can_submit(self) -> bool:
        return self.can(Action.SUBMIT)

    @property
    def can_approve(self) -> bool:
        return self.can(Action.APPROVE)

    @property
    def role_label(self) -> str:
        return "superuser" if self.user.is_superuser else self.role

    @property
    def can_switch(self) -> bool:
        return len(self.memberships) > 1


def signed_in_user(request: HttpRequest) -> User:
    """The user of a request the dashboard serves: its views are ``login_required``, so never anonymous."""
    if isinstance(request.user, AnonymousUser):
        raise PermissionDenied("sign in to use the dashboard")
    return request.user


def current_access(request: HttpRequest) -> Access:
    """The tenant selected in the session if the user is still a member of it, else their first tenant."""
    user = signed_in_user(request)
    memberships = tuple(
        Membership.objects.select_related("tenant")
        .filter(user=user)
        .order_by("tenant__name", "tenant__slug")
    )
    if not memberships:
        raise NoMembership(
            f"you are signed in as {person_name(user)} but not a member of any tenant yet: "
            "ask an administrator to add you to one"
        )
    selected = request.session.get(SESSION_TENANT)
    chosen = next((m for m in memberships if str(m.tenant_id) == selected), memberships[0])
    return Access(tenant=chosen.tenant, role=chosen.role, user=user, memberships=memberships)


def require(access: Access, action: Action) -> None:
    if not access.can(action):
        raise PermissionDenied(
            f"your role in {access.tenant.name} ({access.role_label}) does not allow you to {action} runs"
        )


def select_tenant(request: HttpRequest, tenant_id: str) -> Tenant:
    """Remember the tenant for this session; only a tenant the user is a member of (404 otherwise)."""
    try:
        tenant_uuid = UUID(str(tenant_id))
    except ValueError:
        raise Http404("you are not a member of that tenant") from None
    membership = (
        Membership.objects.select_related("tenant")
        .filter(user=signed_in_user(request), tenant_id=tenant_uuid)
        .first()
    )
    if membership is None:
        raise Http404("you are not a member of that tenant")
    request.session[SESSION_TENANT] = str(membership.tenant_id)
    return membership.tenant
