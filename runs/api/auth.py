"""Who calls the JSON API: an API key (``Authorization: Bearer``), or the dashboard's session.

A request with an ``Authorization`` header is judged by its key alone:
an unknown or revoked key is a 401 even from a browser that is logged in.
Without one, a logged-in user acts for the tenant they selected on the
dashboard (``runs.dashboard.access``), with what their role there allows,
mapped onto the key scopes the endpoints check: a viewer reads, an
operator also submits and controls runs, an approver also approves,
rejects and resolves (a superuser everything). A session request with an
unsafe method needs the CSRF token, as the dashboard's forms do; without
it, 403. Either way ``request.auth`` has ``tenant`` and ``has_scope(scope)``;
``actor_of`` and ``refusal_of`` say who acted and why a scope is missing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from django.contrib.auth.models import AbstractUser
from django.http import HttpRequest
from ninja.errors import HttpError
from ninja.security import HttpBearer
from ninja.utils import check_csrf

from runs.dashboard.access import Access, NoMembership, current_access
from runs.events import Actor
from runs.keys import authenticate_key
from runs.models import ApiKey, Membership, Tenant

Scope = ApiKey.Scope
ROLE_SCOPES: dict[str, frozenset[str]] = {
    Membership.Role.VIEWER: frozenset({Scope.READ}),
    Membership.Role.OPERATOR: frozenset({Scope.READ, Scope.WRITE}),
    Membership.Role.APPROVER: frozenset({Scope.READ, Scope.WRITE, Scope.APPROVE}),
}
CSRF_REFUSED = (
    "a request made with the dashboard's session needs its CSRF token: send the csrftoken cookie's value "
    "in the X-CSRFToken header (or use an API key)"
)


@dataclass(frozen=True)
class SessionCaller:
    """A logged-in user acting through the API for the tenant selected on the dashboard."""

    access: Access

    @property
    def tenant(self) -> Tenant:
        return self.access.tenant

    @property
    def user(self) -> AbstractUser:
        return self.access.user

    def has_scope(self, scope: str) -> bool:
        return self.user.is_superuser or scope in ROLE_SCOPES.get(self.access.role, frozenset())


class ApiRequest(HttpRequest):
    """A request the runs router's auth (``ApiAuth``) let through: ``auth`` is who called."""

    auth: ApiKey | SessionCaller


class Authenticated(Protocol):
    """What a scope check reads of a request: its caller."""

    @property
    def auth(self) -> ApiKey | SessionCaller: ...


def actor_of(caller: ApiKey | SessionCaller) -> Actor:
    """The actor the run's Events record for what ``caller`` did: the user, or the key."""
    if isinstance(caller, SessionCaller):
        return Actor(type="user", id=str(caller.user.pk))
    return Actor(type="api_key", id=str(caller.pk))


def refusal_of(caller: ApiKey | SessionCaller, scope: str) -> str:
    """The 403's detail when ``caller`` lacks ``scope``."""
    if isinstance(caller, SessionCaller):
        return (
            f"your role in {caller.tenant.name} ({caller.access.role_label}) does not allow this "
            f"(it needs the '{scope}' scope)"
        )
    # str(), not repr(): a Scope member's repr is "ApiKey.Scope.WRITE", not its value.
    return f"this API key lacks the '{scope}' scope"


class ApiAuth(HttpBearer):
    """ninja's auth of the runs Router: the Bearer key if one is sent, else the dashboard's session."""

    def __call__(self, request: HttpRequest) -> ApiKey | SessionCaller | None:
        if "Authorization" in request.headers:
            return super().__call__(request)
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        if check_csrf(request) is not None:  # safe methods pass
            raise HttpError(403, CSRF_REFUSED)
        try:
            return SessionCaller(current_access(request))
        except NoMembership as exc:
            raise HttpError(403, str(exc)) from None

    def authenticate(self, request: HttpRequest, token: str) -> ApiKey | None:
        return authenticate_key(token)
