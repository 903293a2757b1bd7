"""Staff on the dashboard: ``is_staff`` alone grants nothing beyond the membership role.

A staff member may take an action their role does not allow only when they
hold the permission the operations console checks for it (``runs.cancel_run``,
``runs.retry_run``, ``runs.approve_run`` for approve and reject,
``runs.resolve_run``); a superuser may do everything. Buttons follow the same
rule as the server, which refuses with 403 and changes nothing.
"""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission
from django.test import Client

import tests.support.agents_dashboard  # noqa: F401  (registers support_reply in this process)
from runs.models import Event, Membership, Message, Run, Step
from tests.support import run_states
from tests.support.factories import MembershipFactory, UserFactory

pytestmark = pytest.mark.django_db

BUTTONS = {
    "approve": ">Approve</button>",
    "reject": ">Reject</button>",
    "resolve": ">Resolve</button>",
    "cancel": ">Cancel run</button>",
    "retry": ">Retry</button>",
    "message": ">Send</button>",
    "new_run": ">New run</a>",
}
# The action, the run state it applies to, and the form data it needs.
ACTIONS = {
    "approve": ("approval", {"step": "2"}),
    "reject": ("approval", {"step": "2"}),
    "resolve": ("ambiguous", {"action": "fail"}),
    "cancel": ("queued", {}),
    "retry": ("failed", {}),
}
PERMISSION_OF = {
    "approve": "approve_run",
    "reject": "approve_run",
    "resolve": "resolve_run",
    "cancel": "cancel_run",
    "retry": "retry_run",
}


def member(
    role: str = Membership.Role.VIEWER,
    *,
    staff: bool = False,
    superuser: bool = False,
    permissions: tuple[str, ...] = (),
) -> tuple[Client, Membership]:
    user = UserFactory(is_staff=staff, is_superuser=superuser)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="runs", codename__in=permissions)
    )
    membership = MembershipFactory(user=user, role=role)
    client = Client()
    client.force_login(user)
    return client, membership


def buttons(client: Client, run: Run) -> set[str]:
    html = client.get(f"/runs/{run.id}/").content.decode()
    return {name for name, text in BUTTONS.items() if text in html}


def snapshot(run: Run) -> tuple:
    return (
        Run.objects.values().get(pk=run.pk),
        list(Step.objects.filter(run=run).order_by("seq").values()),
        Event.objects.filter(run=run).count(),
        Message.objects.filter(run=run).count(),
    )


@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_staff_viewer_without_the_permission_is_refused_and_sees_no_button(action):
    client, membership = member(staff=True)
    state, data = ACTIONS[action]
    run = run_states.build(membership.tenant, state)
    before = snapshot(run)

    assert action not in buttons(client, run)
    response = client.post(
        f"/runs/{run.id}/{action}/", data | {"confirmed": "1"}
    )  # as the dialog posts

    assert response.status_code == 403
    assert "does not allow you to" in response.content.decode()
    assert snapshot(run) == before


@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_staff_viewer_with_the_consoles_permission_may_take_that_action(action):
    client, membership = member(staff=True, permissions=(PERMISSION_OF[action],))
    state, data = ACTIONS[action]
    run = run_states.build(membership.tenant, state)

    assert action in buttons(client, run)
    response = client.post(
        f"/runs/{run.id}/{action}/", data | {"confirmed": "1"}
    )  # as the dialog posts

    assert response.status_code == 302
    assert Run.objects.get(pk=run.pk).status != run.status


def test_one_permission_grants_only_its_actions():
    client, membership = member(staff=True, permissions=("approve_run",))
    run = run_states.waiting_for_approval(membership.tenant)

    assert buttons(client, run) == {"approve", "reject"}
    assert client.post(f"/runs/{run.id}/cancel/").status_code == 403
    assert client.post(f"/runs/{run.id}/messages/", {"text": "hi"}).status_code == 403
    assert client.get("/runs/new/").status_code == 403


def test_the_cancel_permission_does_not_offer_the_submit_form():
    client, membership = member(staff=True, permissions=("cancel_run",))
    run = run_states.queued(membership.tenant)

    assert buttons(client, run) == {"cancel"}
    assert ">New run</a>" not in client.get("/").content.decode()


def test_a_permission_through_a_group_counts_like_one_held_directly():
    client, membership = member(staff=True)
    group = Group.objects.create(name="approvers")
    group.permissions.add(
        Permission.objects.get(content_type__app_label="runs", codename="approve_run")
    )
    membership.user.groups.add(group)
    run = run_states.waiting_for_approval(membership.tenant)

    assert client.post(f"/runs/{run.id}/approve/", {"step": "2"}).status_code == 302


def test_a_permission_without_staff_grants_nothing_on_the_dashboard():
    """The console's permissions are staff powers: a member who is not staff acts by their role only."""
    client, membership = member(permissions=tuple(PERMISSION_OF.values()))
    run = run_states.waiting_for_approval(membership.tenant)

    assert buttons(client, run) == set()
    assert client.post(f"/runs/{run.id}/approve/", {"step": "2"}).status_code == 403


def test_a_staff_operator_keeps_the_operators_actions_and_gets_no_approvals():
    client, membership = member(Membership.Role.OPERATOR, staff=True)
    run = run_states.waiting_for_approval(membership.tenant)

    assert buttons(client, run) == {"cancel", "message", "new_run"}
    assert client.post(f"/runs/{run.id}/approve/", {"step": "2"}).status_code == 403
    assert Run.objects.get(pk=run.pk).status == "waiting_human"


def test_staff_without_a_membership_see_no_tenant():
    user = UserFactory(is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="runs"))
    client = Client()
    client.force_login(user)
    run = run_states.waiting_for_approval(MembershipFactory().tenant)

    assert (
        client.get(f"/runs/{run.id}/").status_code == 403
    )  # no tenant: nothing about the run leaks
    assert client.post(f"/runs/{run.id}/approve/", {"step": "2"}).status_code == 403
    assert Run.objects.get(pk=run.pk).status == "waiting_human"


def test_a_superuser_may_do_everything_in_their_tenant():
    client, membership = member(superuser=True, staff=True)
    run = run_states.waiting_for_approval(membership.tenant)

    assert buttons(client, run) == {"approve", "reject", "cancel", "message", "new_run"}
    assert (
        '<span class="role" data-testid="role">superuser</span>' in client.get("/").content.decode()
    )
    assert client.post(f"/runs/{run.id}/approve/", {"step": "2"}).status_code == 302
    assert Run.objects.get(pk=run.pk).status == "queued"
    assert client.get("/runs/new/").status_code == 200


@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_superuser_may_take_every_action(action):
    client, membership = member(superuser=True)
    state, data = ACTIONS[action]
    run = run_states.build(membership.tenant, state)

    assert client.post(f"/runs/{run.id}/{action}/", data | {"confirmed": "1"}).status_code == 302


def test_a_staff_approver_keeps_every_action_of_the_role():
    client, membership = member(Membership.Role.APPROVER, staff=True)
    run = run_states.waiting_for_approval(membership.tenant)

    assert buttons(client, run) == {"approve", "reject", "cancel", "message", "new_run"}
    assert client.post(f"/runs/{run.id}/approve/", {"step": "2"}).status_code == 302
