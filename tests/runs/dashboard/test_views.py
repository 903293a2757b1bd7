"""The dashboard through Django's test client: login, tenant scoping, roles, forms, polling, escaping."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.files.base import ContentFile
from django.test import Client
from django.utils import timezone

import tests.support.agents_dashboard  # noqa: F401  (registers support_reply in this process)
from runs.dashboard import presenters
from runs.dashboard.access import SESSION_TENANT
from runs.dashboard.forms import KindInputForm
from runs.models import Artifact, Event, Membership, Message, Run, Step
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.factories import MembershipFactory, TenantFactory, UserFactory
from tests.support.run_states import force_status, waiting_for_resolution
from workers.worker import Worker, WorkerOptions

HTMX = {"HX-Request": "true"}
XSS = "<script>alert(1)</script>"
VISIBLE_ONLY = (
    "every 2s, visibilitychange from:document"  # paused on hidden tabs by static/js/poll.js
)
REPLY = {"customer": "ana@example.com", "order": "A-1001", "message": "My kettle arrived broken."}


def run_worker_until_idle() -> None:
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()


@pytest.fixture
def member(db):
    return MembershipFactory()


@pytest.fixture
def member_client(client, member):
    client.force_login(member.user)
    return client


def login(role: str, tenant=None) -> tuple[Client, Membership]:
    membership = MembershipFactory(role=role, **({"tenant": tenant} if tenant else {}))
    client = Client()
    client.force_login(membership.user)
    return client, membership


def detail_url(run) -> str:
    return f"/runs/{run.id}/"


def waiting_for_approval(tenant, proposal=None) -> Run:
    """Test setup only: a run whose second step waits for an approver, as ctx.approval leaves it."""
    run = submit_run(tenant=tenant, kind="approve_then_act", input={})
    Step.objects.create(
        run=run, seq=1, name="draft", status="done", output={"fields": {"stage": "won"}}
    )
    Step.objects.create(
        run=run,
        seq=2,
        name="update_crm",
        kind="approval",
        status="waiting",
        input={"proposal": proposal if proposal is not None else {"fields": {"stage": "won"}}},
    )
    return force_status(run, "waiting_human", steps_done=1, current_step="update_crm", attempt=1)


def flashes(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# Authentication and tenant scoping


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/", f"/runs/{uuid.uuid4()}/", "/runs/new/"])
def test_anonymous_user_is_redirected_to_login(client, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


@pytest.mark.django_db
def test_a_poll_from_an_ended_session_reloads_the_page_instead_of_swapping_in_the_login_form(
    client,
):
    for path in ("/", f"/runs/{uuid.uuid4()}/?state=x&seen=y"):
        response = client.get(path, headers=HTMX)

        assert response.status_code == 200
        assert response["HX-Refresh"] == "true"
        assert response.content == b""


@pytest.mark.django_db
def test_htmx_is_served_from_our_static_files(member_client):
    html = member_client.get("/").content.decode()

    assert '<script src="/static/django_htmx/htmx-2.min.js" defer></script>' in html
    assert "://" not in html.split("<body")[0]  # no CDN, nothing from another origin
    script = member_client.get("/static/django_htmx/htmx-2.min.js")
    assert script.status_code == 200
    assert b"htmx" in b"".join(script.streaming_content)


@pytest.mark.django_db
def test_login_page_renders_a_form(client):
    response = client.get("/accounts/login/?next=/")

    assert response.status_code == 200
    assert b'name="username"' in response.content
    assert b'name="password"' in response.content
    assert b"csrfmiddlewaretoken" in response.content


@pytest.mark.django_db
def test_logging_in_through_the_form_leads_to_the_run_list(client, member):
    response = client.post(
        "/accounts/login/",
        {"username": member.user.username, "password": "secret-pass", "next": "/"},
        follow=True,
    )

    assert response.redirect_chain == [("/", 302)]
    assert response.status_code == 200
    assert b"<h1>Runs</h1>" in response.content


@pytest.mark.django_db
def test_member_sees_only_their_tenants_runs(member_client, member):
    mine = submit_run(tenant=member.tenant, kind="echo", input={"text": "mine"})
    theirs = submit_run(tenant=TenantFactory(), kind="echo", input={"text": "theirs"})

    response = member_client.get("/")

    assert response.status_code == 200
    assert detail_url(mine) in response.content.decode()
    assert detail_url(theirs) not in response.content.decode()
    assert member.tenant.name in response.content.decode()


@pytest.mark.django_db
def test_another_tenants_run_is_not_found(member_client):
    theirs = submit_run(tenant=TenantFactory(), kind="echo", input={"text": "theirs"})

    assert member_client.get(detail_url(theirs)).status_code == 404
    assert member_client.get(detail_url(theirs), headers=HTMX).status_code == 404
    assert member_client.post(detail_url(theirs) + "cancel/").status_code == 404
    assert fresh(theirs).status == "queued"


@pytest.mark.django_db
def test_unknown_run_is_not_found(member_client):
    assert member_client.get(f"/runs/{uuid.uuid4()}/").status_code == 404


@pytest.mark.django_db
def test_user_without_membership_gets_a_403_page_that_names_them_and_leads_out(client):
    client.force_login(UserFactory(username="lonely"))

    response = client.get("/")
    assert response.status_code == 403
    html = response.content.decode()
    assert "lonely" in html and "not a member of any tenant" in html
    assert 'action="/accounts/logout/"' in html


@pytest.mark.django_db
def test_empty_run_list_says_so(member_client):
    response = member_client.get("/")

    assert response.status_code == 200
    assert b"No runs yet" in response.content


# The tenant switcher


@pytest.mark.django_db
def test_a_user_with_one_tenant_gets_no_switcher(member_client, member):
    html = member_client.get("/").content.decode()

    assert 'name="tenant"' not in html
    assert f'<span class="tenant" data-testid="tenant">{member.tenant.name}</span>' in html


@pytest.mark.django_db
def test_switching_tenants_scopes_every_page_to_the_selected_tenant(client):
    user = UserFactory()
    acme = MembershipFactory(user=user, tenant__name="Acme", role="operator").tenant
    zeta = MembershipFactory(user=user, tenant__name="Zeta", role="viewer").tenant
    MembershipFactory(tenant__name="Other")  # a tenant the user is not a member of
    acme_run = submit_run(tenant=acme, kind="echo", input={"text": "acme"})
    zeta_run = submit_run(tenant=zeta, kind="echo", input={"text": "zeta"})
    client.force_login(user)

    html = client.get("/").content.decode()
    # Both of the user's tenants are offered, and only those; the first by name is selected.
    assert '<select id="tenant-switch" name="tenant">' in html
    assert f'<option value="{acme.id}" selected>Acme</option>' in html
    assert f'<option value="{zeta.id}">Zeta</option>' in html
    assert "Other" not in html
    assert detail_url(acme_run) in html and detail_url(zeta_run) not in html

    response = client.post("/tenant/", {"tenant": str(zeta.id)}, follow=True)

    assert response.redirect_chain == [("/", 302)]
    assert client.session[SESSION_TENANT] == str(zeta.id)
    html = response.content.decode()
    assert f'<option value="{zeta.id}" selected>Zeta</option>' in html
    assert detail_url(zeta_run) in html and detail_url(acme_run) not in html
    assert "Now showing the runs of Zeta." in flashes(response)
    assert client.get(detail_url(acme_run)).status_code == 404
    assert client.get(detail_url(zeta_run)).status_code == 200
    # The role follows the tenant: a viewer in Zeta may not cancel there.
    assert '<span class="role" data-testid="role">viewer</span>' in html
    assert client.post(detail_url(zeta_run) + "cancel/").status_code == 403
    assert fresh(zeta_run).status == "queued"


@pytest.mark.django_db
def test_switching_to_a_tenant_one_is_not_a_member_of_is_refused(member_client, member):
    other = TenantFactory()

    assert member_client.post("/tenant/", {"tenant": str(other.id)}).status_code == 404
    assert member_client.post("/tenant/", {"tenant": "not-a-uuid"}).status_code == 404
    assert SESSION_TENANT not in member_client.session
    assert member_client.get("/tenant/").status_code == 405


@pytest.mark.django_db
def test_a_selected_tenant_the_user_left_falls_back_to_a_current_one(member_client, member):
    other = MembershipFactory(user=member.user)
    session = member_client.session
    session[SESSION_TENANT] = str(other.tenant_id)
    session.save()
    other.delete()

    html = member_client.get("/").content.decode()

    assert member.tenant.name in html


# Roles: buttons are hidden, and the server refuses


def _controls(html: str) -> dict[str, bool]:
    return {
        "cancel": ">Cancel run</button>" in html,
        "pause": ">Pause</button>" in html,
        "approve": ">Approve</button>" in html,
        "reject": ">Reject</button>" in html,
        "message": ">Send</button>" in html,
        "new_run": ">New run</a>" in html,
    }


@pytest.mark.django_db
@pytest.mark.parametrize(
    "role, expected",
    [
        (
            "viewer",
            {
                "cancel": False,
                "pause": False,
                "approve": False,
                "reject": False,
                "message": False,
                "new_run": False,
            },
        ),
        (
            "operator",
            {
                "cancel": True,
                "pause": False,
                "approve": False,
                "reject": False,
                "message": True,
                "new_run": True,
            },
        ),
        (
            "approver",
            {
                "cancel": True,
                "pause": False,
                "approve": True,
                "reject": True,
                "message": True,
                "new_run": True,
            },
        ),
    ],
)
def test_the_buttons_of_a_waiting_approval_follow_the_role(role, expected):
    client, membership = login(role)
    run = waiting_for_approval(membership.tenant)

    html = client.get(detail_url(run)).content.decode()

    assert _controls(html) == expected
    # Everyone who may read the run sees what is proposed.
    assert 'data-testid="proposal"' in html
    assert ("An approver decides" in html) is (role != "approver")


# What staff and superusers may do beyond their role: tests/runs/dashboard/test_access.py


ALL_ACTIONS = ["cancel", "pause", "resume", "retry", "approve", "reject", "resolve", "messages"]


@pytest.mark.django_db
@pytest.mark.parametrize("action", ALL_ACTIONS)
def test_a_forged_post_from_a_viewer_is_refused_and_changes_nothing(action):
    client, membership = login("viewer")
    run = waiting_for_approval(membership.tenant)
    before = fresh(run)
    data = {"text": "hello", "comment": "ok", "action": "done", "output": "{}"}

    response = client.post(detail_url(run) + f"{action}/", data)

    assert response.status_code == 403
    assert "does not allow you to" in response.content.decode()
    after = fresh(run)
    assert (after.status, after.last_event_seq, after.cancel_requested_at) == (
        before.status,
        before.last_event_seq,
        before.cancel_requested_at,
    )
    assert not Message.objects.filter(run=run).exists()
    assert Step.objects.get(run=run, seq=2).status == "waiting"


@pytest.mark.django_db
@pytest.mark.parametrize("action", ["approve", "reject", "resolve"])
def test_an_operator_may_not_decide_approvals(action):
    client, membership = login("operator")
    run = waiting_for_approval(membership.tenant)

    response = client.post(detail_url(run) + f"{action}/", {"action": "done"})

    assert response.status_code == 403
    assert fresh(run).status == "waiting_human"


@pytest.mark.django_db
def test_a_viewer_may_not_open_or_post_the_submit_form():
    client, membership = login("viewer")

    assert client.get("/runs/new/").status_code == 403
    response = client.post("/runs/new/?kind=echo", {"input-text": "hi", "input-times": "1"})
    assert response.status_code == 403
    assert not Run.objects.filter(tenant=membership.tenant).exists()


@pytest.mark.django_db
def test_posts_without_a_csrf_token_are_refused(member):
    client = Client(enforce_csrf_checks=True)
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})

    assert client.post(detail_url(run) + "cancel/").status_code == 403
    assert fresh(run).status == "queued"
    # Every form on the page carries the token.
    html = client.get(detail_url(run)).content.decode()
    # (the confirmation dialog's form only closes the dialog: method="dialog" posts nothing)
    assert html.count("<form") - html.count('<form method="dialog"') == html.count(
        'name="csrfmiddlewaretoken"'
    )


@pytest.mark.django_db
def test_actions_answer_only_to_post(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})

    for action in ALL_ACTIONS:
        assert member_client.get(detail_url(run) + f"{action}/").status_code == 405


# Actions


@pytest.mark.django_db
def test_an_operator_cancels_a_queued_run(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})

    response = member_client.post(detail_url(run) + "cancel/", {"confirmed": "1"}, follow=True)

    assert response.redirect_chain == [(detail_url(run), 302)]
    assert flashes(response) == ["Run cancelled."]
    assert fresh(run).status == "cancelled"
    event = Event.objects.filter(run=run).order_by("-seq").first()
    assert (event.type, event.actor_type, event.actor_id) == (
        "run.cancelled",
        "user",
        str(member.user.pk),
    )
    html = response.content.decode()
    assert 'data-testid="status">Cancelled</span>' in html
    assert ">Retry</button>" in html and ">Cancel run</button>" not in html


@pytest.mark.django_db
def test_cancelling_a_running_run_is_a_request_the_page_shows(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}), "running"
    )

    response = member_client.post(detail_url(run) + "cancel/", {"confirmed": "1"}, follow=True)

    assert flashes(response) == ["Cancel requested: the run stops at the end of its current step."]
    run = fresh(run)
    assert run.status == "running" and run.cancel_requested_at is not None
    html = response.content.decode()
    assert '<span class="note">cancel requested</span>' in html
    assert ">Cancel run</button>" not in html


@pytest.mark.django_db
def test_pause_and_resume_a_queued_run(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})
    assert ">Pause</button>" in member_client.get(detail_url(run)).content.decode()

    response = member_client.post(detail_url(run) + "pause/", follow=True)
    assert flashes(response) == ["Run paused."]
    assert fresh(run).status == "paused"
    assert ">Resume</button>" in response.content.decode()

    response = member_client.post(detail_url(run) + "resume/", follow=True)
    assert flashes(response) == ["Run resumed."]
    assert fresh(run).status == "queued"


@pytest.mark.django_db
def test_an_action_the_state_no_longer_allows_is_reported_not_forced(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        "done",
        finished_at=timezone.now(),
    )

    response = member_client.post(detail_url(run) + "cancel/", {"confirmed": "1"}, follow=True)

    assert response.status_code == 200
    assert flashes(response) == [
        "Nothing changed: cannot cancel a run that is done. The page shows the run as it is now."
    ]
    assert fresh(run).status == "done"


@pytest.mark.django_db
def test_retry_a_failed_run(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        "failed",
        finished_at=timezone.now(),
        error="boom",
        error_kind="fatal",
    )

    response = member_client.post(detail_url(run) + "retry/", follow=True)

    assert flashes(response) == ["Run queued again."]
    assert fresh(run).status == "queued"


@pytest.mark.django_db
def test_retrying_a_run_that_hit_its_deadline_asks_for_a_larger_one(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        "failed",
        finished_at=timezone.now(),
        error="out of time",
        error_kind="deadline",
        running_seconds=60,
        deadline_seconds=60,
    )
    html = member_client.get(detail_url(run)).content.decode()
    assert "New deadline (seconds)" in html
    assert "Retry with a larger deadline" in html  # the advice

    response = member_client.post(detail_url(run) + "retry/", follow=True)
    assert "retry with a larger deadline_seconds" in flashes(response)[0]
    assert fresh(run).status == "failed"

    response = member_client.post(
        detail_url(run) + "retry/", {"deadline_seconds": "600"}, follow=True
    )
    assert flashes(response) == ["Run queued again."]
    assert fresh(run).deadline_seconds == 600


@pytest.mark.django_db
def test_retry_from_a_step_out_of_range_is_an_inline_error(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        "failed",
        finished_at=timezone.now(),
        error="boom",
        error_kind="fatal",
    )

    response = member_client.post(detail_url(run) + "retry/", {"from_step": "7"})

    assert response.status_code == 422
    assert (
        '<p class="field-error">from_step must be between 1 and 1</p>' in response.content.decode()
    )
    assert fresh(run).status == "failed"


@pytest.mark.django_db
def test_an_approver_approves_with_a_comment():
    client, membership = login("approver")
    run = waiting_for_approval(membership.tenant)
    html = client.get(detail_url(run)).content.decode()
    assert '<input type="hidden" name="step" value="2"' in html

    response = client.post(
        detail_url(run) + "approve/", {"comment": "looks right", "step": "2"}, follow=True
    )

    assert flashes(response) == ["Approved: the run continues."]
    assert fresh(run).status == "queued"
    decision = Step.objects.get(run=run, seq=2)
    assert decision.status == "done"
    assert decision.output["approved"] is True
    assert decision.output["comment"] == "looks right"
    assert decision.output["by"] == f"user:{membership.user.pk}"


@pytest.mark.django_db
def test_an_approver_rejects():
    client, membership = login("approver")
    run = waiting_for_approval(membership.tenant)

    response = client.post(
        detail_url(run) + "reject/", {"comment": "no", "step": "2", "confirmed": "1"}, follow=True
    )

    assert flashes(response) == ["Rejected: the run continues without it."]
    assert Step.objects.get(run=run, seq=2).output["approved"] is False


@pytest.mark.django_db
def test_a_decision_on_a_stale_card_is_refused():
    client, membership = login("approver")
    run = waiting_for_approval(membership.tenant)

    response = client.post(detail_url(run) + "approve/", {"step": "1"}, follow=True)

    assert "step 1 is not the pending approval (step 2 is)" in flashes(response)[0]
    assert fresh(run).status == "waiting_human"


@pytest.mark.django_db
def test_an_approver_resolves_an_ambiguous_step():
    client, membership = login("approver")
    run = waiting_for_resolution(membership.tenant)
    html = client.get(detail_url(run)).content.decode()
    assert "A person must decide: charge" in html
    assert "the worker died while the charge was in flight" in html

    bad = client.post(detail_url(run) + "resolve/", {"action": "done", "output": "{not json"})
    assert bad.status_code == 422
    assert "Enter a valid JSON." in bad.content.decode()
    assert fresh(run).status == "waiting_human"

    response = client.post(
        detail_url(run) + "resolve/", {"action": "done", "output": '{"charged": 42}'}, follow=True
    )
    assert flashes(response) == ["Marked done: the run continues."]
    assert fresh(run).status == "queued"
    assert Step.objects.get(run=run, seq=1).output == {"charged": 42}


@pytest.mark.django_db
def test_a_message_is_posted_into_a_live_run_and_listed_escaped(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="chat", input={}), "waiting", attempt=1
    )
    html = member_client.get(detail_url(run)).content.decode()
    assert "The run waits for a message: write one below." in html

    response = member_client.post(
        detail_url(run) + "messages/", {"text": f"hello {XSS}"}, follow=True
    )

    assert flashes(response) == ["Message sent."]
    assert Message.objects.get(run=run).text == f"hello {XSS}"
    assert fresh(run).status == "queued"  # a run waiting for a message goes back to the queue
    html = response.content.decode()
    assert "hello &lt;script&gt;alert(1)&lt;/script&gt;" in html and XSS not in html
    assert "not read yet" in html


@pytest.mark.django_db
def test_an_empty_message_is_an_inline_error(member_client, member):
    run = force_status(submit_run(tenant=member.tenant, kind="chat", input={}), "waiting")

    response = member_client.post(detail_url(run) + "messages/", {"text": "   "})

    assert response.status_code == 422
    assert '<p class="field-error" data-testid="message-error">This field is required.</p>' in (
        response.content.decode()
    )
    assert not Message.objects.filter(run=run).exists()


# The submit form


@pytest.mark.django_db
def test_the_submit_page_lists_the_kinds_with_their_descriptions(member_client):
    html = member_client.get("/runs/new/").content.decode()

    assert '<a href="?kind=support_reply"><strong>support_reply</strong></a>' in html
    assert "Read a customer&#x27;s message, look up the order" in html


@pytest.mark.django_db
def test_the_form_is_built_from_the_kinds_schema(member_client):
    html = member_client.get("/runs/new/?kind=support_reply").content.decode()

    assert '<input type="text" name="input-customer" maxlength="120" minlength="3" required' in html
    assert (
        '<textarea name="input-message" cols="40" rows="3" maxlength="2000" minlength="1" required'
        in html
    )
    assert '<select name="input-tone" id="id_input-tone">' in html
    assert '<option value="friendly" selected>friendly</option>' in html
    assert '<option value="formal">formal</option>' in html
    assert (
        '<input type="number" name="input-refund_limit_eur" value="50" min="0" max="500" step="any"'
        in html
    )
    assert '<input type="number" name="input-drafts" value="1" min="1" max="3"' in html
    assert '<input type="checkbox" name="input-urgent"' in html
    assert "The most the agent may offer back" in html  # the field's description
    assert 'name="idempotency_key"' in html


@pytest.mark.django_db
def test_submitting_the_form_creates_the_run_and_opens_its_page(member_client, member):
    data = {
        "input-customer": "ana@example.com",
        "input-order": "A-1001",
        "input-message": "Broken kettle",
        "input-tone": "formal",
        "input-refund_limit_eur": "20.5",
        "input-drafts": "2",
        "input-urgent": "on",
        "idempotency_key": "form-1",
    }

    response = member_client.post("/runs/new/?kind=support_reply", data)

    run = Run.objects.get(tenant=member.tenant)
    assert response.status_code == 302
    assert response["Location"] == detail_url(run)
    assert run.kind == "support_reply"
    assert run.input == {
        "customer": "ana@example.com",
        "order": "A-1001",
        "message": "Broken kettle",
        "tone": "formal",
        "refund_limit_eur": 20.5,
        "drafts": 2,
        "urgent": True,
    }
    event = Event.objects.get(run=run, seq=1)
    assert (event.actor_type, event.actor_id) == ("user", str(member.user.pk))
    assert flashes(member_client.get(response["Location"])) == ["Run submitted."]

    # The same form sent twice (a double click, a resent POST) finds the same run.
    again = member_client.post("/runs/new/?kind=support_reply", data, follow=True)
    assert again.redirect_chain == [(detail_url(run), 302)]
    assert flashes(again) == ["This form was already submitted: here is its run."]
    assert Run.objects.filter(tenant=member.tenant).count() == 1


@pytest.mark.django_db
def test_blank_optional_fields_take_the_kinds_defaults(member_client, member):
    data = {
        "input-customer": "ana@example.com",
        "input-order": "A-1001",
        "input-message": "Hi",
        "input-tone": "friendly",
        "input-refund_limit_eur": "",
        "input-drafts": "",
    }

    assert member_client.post("/runs/new/?kind=support_reply", data).status_code == 302

    assert Run.objects.get(tenant=member.tenant).input == {
        "customer": "ana@example.com",
        "order": "A-1001",
        "message": "Hi",
        "tone": "friendly",
        "refund_limit_eur": 50.0,
        "drafts": 1,
        "urgent": False,
    }


@pytest.mark.django_db
def test_validation_errors_are_shown_next_to_their_fields(member_client, member):
    data = {
        "input-customer": "ana.example.com",
        "input-order": "A-1001",
        "input-message": "",
        "input-tone": "rude",
        "input-drafts": "9",
        "input-refund_limit_eur": "10",
    }

    response = member_client.post("/runs/new/?kind=support_reply", data)

    assert response.status_code == 422
    html = response.content.decode()
    assert '<p class="field-error" data-testid="error-message">This field is required.</p>' in html
    assert (
        '<p class="field-error" data-testid="error-tone">Select a valid choice. rude is not one of the'
        " available choices.</p>"
    ) in html
    assert (
        '<p class="field-error" data-testid="error-drafts">Ensure this value is less than or equal to 3.</p>'
        in html
    )
    # What the user typed is kept.
    assert 'value="ana.example.com"' in html
    assert not Run.objects.exists()

    # Errors only the kind's own validation finds are put next to their field too.
    data.update({"input-message": "Hi", "input-tone": "friendly", "input-drafts": "1"})
    response = member_client.post("/runs/new/?kind=support_reply", data)
    assert response.status_code == 422
    assert (
        '<p class="field-error" data-testid="error-customer">Value error, must be an email address, like'
        " ana@example.com</p>"
    ) in response.content.decode()
    assert not Run.objects.exists()


@pytest.mark.django_db
def test_a_kind_without_a_schema_takes_a_json_object(member_client, member):
    html = member_client.get("/runs/new/?kind=approve_then_act").content.decode()
    assert '<textarea name="input-input"' in html

    bad = member_client.post("/runs/new/?kind=approve_then_act", {"input-input": "{oops"})
    assert bad.status_code == 422
    assert "Enter a valid JSON." in bad.content.decode()

    not_object = member_client.post("/runs/new/?kind=approve_then_act", {"input-input": "[1, 2]"})
    assert not_object.status_code == 422
    assert "input must be a JSON object" in not_object.content.decode()

    ok = member_client.post("/runs/new/?kind=approve_then_act", {"input-input": '{"log": null}'})
    assert ok.status_code == 302
    assert Run.objects.get(tenant=member.tenant).input == {"log": None}


@pytest.mark.django_db
def test_a_full_queue_is_reported_on_the_form(member_client, member):
    member.tenant.max_queued = 0
    member.tenant.save()

    response = member_client.post("/runs/new/?kind=echo", {"input-text": "hi", "input-times": "1"})

    assert response.status_code == 422
    assert "the tenant&#x27;s queue is full" in response.content.decode()


@pytest.mark.django_db
def test_an_unknown_kind_is_not_found(member_client):
    response = member_client.get("/runs/new/?kind=nope")

    assert response.status_code == 404
    assert "There is no kind named “nope”." in response.content.decode()


def test_the_form_builder_covers_the_json_schema_types():
    schema = {
        "$defs": {"Colour": {"enum": ["red", "blue"], "type": "string", "title": "Colour"}},
        "properties": {
            "name": {"type": "string", "maxLength": 20, "title": "Name"},
            "count": {"type": "integer", "exclusiveMinimum": 0, "maximum": 9, "default": 3},
            "ratio": {"type": "number", "minimum": 0.5},
            "ok": {"type": "boolean", "default": True},
            "colour": {"$ref": "#/$defs/Colour"},
            "size": {"enum": [1, 2, 3], "type": "integer", "default": 2},
            "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
            "limit": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
        },
        "required": ["name", "colour", "limit"],
    }
    form = KindInputForm(
        schema,
        {
            "input-name": "x",
            "input-count": "4",
            "input-ratio": "0.75",
            "input-colour": "blue",
            "input-size": "3",
            "input-limit": "",
            "input-tags": '["a"]',
        },
    )

    assert form.is_valid(), form.errors
    assert form.input_data() == {
        "name": "x",
        "count": 4,
        "ratio": 0.75,
        "ok": False,
        "colour": "blue",
        "size": 3,
        "limit": None,
        "tags": ["a"],
    }
    assert form.fields["count"].min_value == 1 and form.fields["count"].max_value == 9
    assert form.fields["name"].required and not form.fields["note"].required

    invalid = KindInputForm(
        schema,
        {"input-name": "", "input-count": "0", "input-ratio": "0.1", "input-colour": "green"},
    )
    assert not invalid.is_valid()
    assert set(invalid.errors) == {"name", "count", "ratio", "colour"}


# The run list


@pytest.mark.django_db
def test_the_list_filters_by_status_and_kind_and_searches_by_id(member_client, member):
    echo = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})
    steps = submit_run(tenant=member.tenant, kind="steps", input={"steps": 2})
    failed = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "x"}),
        "failed",
        finished_at=timezone.now(),
        error="boom",
        error_kind="fatal",
    )

    def shown(query: str) -> set:
        html = member_client.get("/" + query).content.decode()
        return {run.id for run in (echo, steps, failed) if detail_url(run) in html}

    assert shown("") == {echo.id, steps.id, failed.id}
    assert shown("?status=failed") == {failed.id}
    assert shown("?kind=echo") == {echo.id, failed.id}
    assert shown("?kind=echo&status=queued") == {echo.id}
    assert shown(f"?q={steps.id}") == {steps.id}
    assert shown(f"?q={str(failed.id)[:8].upper()}") == {failed.id}

    html = member_client.get("/?status=cancelled").content.decode()
    assert "No runs match these filters." in html
    # Anything else searches the runs' titles and inputs.
    html = member_client.get("/?q=xyz").content.decode()
    assert "No runs match these filters." in html
    html = member_client.get("/?q=%00").content.decode()
    assert 'data-testid="search-error"' in html


@pytest.mark.django_db
def test_the_list_pages_with_a_keyset_cursor_keeping_the_filters(member_client, member):
    base = timezone.now()
    runs = [
        submit_run(tenant=member.tenant, kind="echo", input={"text": str(i)}) for i in range(53)
    ]
    for i, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(created_at=base - timedelta(seconds=i))

    first = member_client.get("/?kind=echo")
    page = first.context["page"]
    assert [r.id for r in page.items] == [r.id for r in runs[:50]]
    next_url = first.context["next_url"]
    assert next_url.startswith("?kind=echo&cursor=")
    assert (
        f'<a href="{next_url.replace("&", "&amp;")}" rel="next">Older runs →</a>'
        in first.content.decode()
    )

    second = member_client.get("/" + next_url)
    assert [r.id for r in second.context["page"].items] == [r.id for r in runs[50:]]
    assert second.context["next_url"] is None

    broken = member_client.get("/?cursor=garbage")
    assert broken.status_code == 200
    assert "invalid cursor" in broken.content.decode()


@pytest.mark.django_db
def test_keyset_pages_split_runs_created_in_the_same_instant_exactly_once(member_client, member):
    runs = [
        submit_run(tenant=member.tenant, kind="echo", input={"text": str(i)}) for i in range(120)
    ]
    same = timezone.now()
    Run.objects.filter(pk__in=[r.pk for r in runs[:70]]).update(created_at=same)
    Run.objects.filter(pk__in=[r.pk for r in runs[70:]]).update(
        created_at=same - timedelta(seconds=1)
    )

    seen, url = [], "/"
    while url:
        response = member_client.get(url if url.startswith("/") else "/" + url)
        seen += [r.id for r in response.context["page"].items]
        url = response.context["next_url"]

    assert len(seen) == len(set(seen)) == 120


@pytest.mark.django_db
def test_approvers_see_how_many_runs_wait_for_them():
    client, membership = login("approver")
    waiting_for_approval(membership.tenant)
    waiting_for_approval(membership.tenant)
    waiting_for_resolution(membership.tenant)
    submit_run(tenant=membership.tenant, kind="echo", input={"text": "hi"})

    html = client.get("/").content.decode()

    assert '<a href="/?status=waiting_human">3 runs wait for your approval →</a>' in html
    operator = Client()
    operator.force_login(MembershipFactory(tenant=membership.tenant, role="operator").user)
    assert "wait for your approval" not in operator.get("/").content.decode()


@pytest.mark.django_db
def test_the_list_polls_while_a_run_on_it_is_unfinished(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="steps", input={"steps": 4}),
        "running",
        current_step="step2",
        steps_done=1,
        steps_total=4,
    )

    html = member_client.get("/?kind=steps").content.decode()
    assert 'hx-get="/?kind=steps"' in html
    assert VISIBLE_ONLY in html

    partial = member_client.get("/?kind=steps", headers=HTMX)
    assert partial.status_code == 200
    fragment = partial.content.decode()
    assert fragment.lstrip().startswith('<section id="runs"') and "<html" not in fragment
    assert '<div class="muted row-summary">step2</div>' in fragment
    assert '<progress class="progress-running" max="4" value="1"' in fragment

    force_status(run, "done", finished_at=timezone.now(), current_step="", steps_done=4)
    finished = member_client.get("/?kind=steps", headers=HTMX)
    assert finished.status_code == 286
    assert "hx-get" not in finished.content.decode()
    assert '<span class="badge badge-done">Done</span>' in finished.content.decode()


@pytest.mark.django_db
def test_list_page_query_count_is_pinned(django_assert_num_queries):
    client, membership = login("approver")
    for i in range(30):
        submit_run(tenant=membership.tenant, kind="echo", input={"text": str(i)})
    waiting_for_approval(membership.tenant)

    # session, user, memberships with their tenants, one page of runs, the approvals count
    with django_assert_num_queries(5):
        response = client.get("/?kind=echo")
    assert response.status_code == 200
    with django_assert_num_queries(5):
        partial = client.get("/?kind=echo", headers=HTMX)
    assert partial.status_code == 200


# The run page and its polled partials


@pytest.mark.django_db
def test_run_page_shows_status_progress_elapsed_attempt_and_cost(member_client, member):
    run = submit_run(tenant=member.tenant, kind="steps", input={"steps": 4}, cost_ceiling_cents=50)
    force_status(
        run,
        "running",
        current_step="step2",
        steps_done=1,
        steps_total=4,
        attempt=1,
        started_at=timezone.now() - timedelta(seconds=75),
        cost_cents=Decimal("12.5"),
    )

    response = member_client.get(detail_url(run))

    assert response.status_code == 200
    assert "runs/detail.html" in [t.name for t in response.templates]
    html = response.content.decode()
    assert '<span class="badge badge-running" data-testid="status">Running</span>' in html
    assert '<dd data-testid="current-step">step2</dd>' in html
    assert '<dd data-testid="steps-done">1 of 4</dd>' in html
    assert '<progress class="progress-running" max="4" value="1"' in html
    assert re.search(
        r'<dd data-testid="elapsed">1 min 1\d s</dd>', html
    )  # 75 s, and a slow machine's more
    # A first attempt is no failure: the retry budget shows only once something failed.
    assert 'data-testid="failed-tries"' not in html and "Attempt" not in html
    assert (
        '<dd data-testid="cost">12.5¢ of 50¢ ceiling<meter min="0" max="100" low="70" high="90" optimum="0"'
        ' value="25"' in html
    )
    # While the run can still change, the progress section polls itself, only while the tab is visible.
    state, seen = presenters.controls_version(fresh(run)), presenters.timeline_version(fresh(run))
    assert (
        f'hx-get="{detail_url(run)}?state={state}&amp;seen={seen}" hx-trigger="{VISIBLE_ONLY}'
        in html
    )
    assert "<html" in html and "← All runs" in html


@pytest.mark.django_db
def test_queued_run_page_shows_placeholders(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})

    html = member_client.get(detail_url(run)).content.decode()

    assert 'data-testid="status">Queued</span>' in html
    assert '<dd data-testid="current-step">—</dd>' in html
    assert '<dd data-testid="steps-done">0 steps</dd>' in html
    assert '<dd data-testid="elapsed">—</dd>' in html
    assert "No steps yet." in html


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["queued", "running", "paused", "waiting", "waiting_human"])
def test_htmx_partial_of_a_live_run_is_200_and_keeps_polling(member_client, member, status):
    run = force_status(submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}), status)

    response = member_client.get(detail_url(run), headers=HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="progress"')
    assert "<html" not in html and "<header" not in html and "All runs" not in html
    assert VISIBLE_ONLY in html
    assert f'data-testid="status">{presenters.status_label(status)}</span>' in html


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
def test_htmx_partial_of_a_terminal_run_is_286_and_stops_polling(member_client, member, status):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        status,
        finished_at=timezone.now(),
    )

    response = member_client.get(detail_url(run), headers=HTMX)

    assert response.status_code == 286
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="progress"')
    assert "<html" not in html
    # The swapped-in fragment carries no trigger of its own either.
    assert "hx-get" not in html and "hx-trigger" not in html


@pytest.mark.django_db
def test_full_page_of_a_terminal_run_is_200_without_polling(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        "done",
        finished_at=timezone.now(),
    )

    response = member_client.get(detail_url(run))

    assert response.status_code == 200
    assert b"hx-trigger" not in response.content


def poll_url(run, *, state=None, seen=None) -> str:
    """The URL a page showing ``run`` polls (or one whose versions are ``state`` and ``seen``)."""
    run = fresh(run)
    state = presenters.controls_version(run) if state is None else state
    seen = presenters.timeline_version(run) if seen is None else seen
    return f"{detail_url(run)}?state={state}&seen={seen}"


def _poll(client, run, *, state=None, seen=None):
    return client.get(poll_url(run, state=state, seen=seen), headers=HTMX)


@pytest.mark.django_db
def test_a_poll_refreshes_controls_and_timeline_only_when_they_changed(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="steps", input={"steps": 3}),
        "running",
        current_step="step1",
        steps_total=3,
    )

    quiet = _poll(member_client, run).content.decode()
    assert 'id="controls"' not in quiet and 'id="work"' not in quiet

    moved = _poll(member_client, run, seen="old").content.decode()
    assert '<section id="work" class="work" hx-swap-oob="true">' in moved
    assert 'id="controls"' not in moved

    changed = _poll(member_client, run, state="queued.0.0").content.decode()
    assert '<section id="controls" class="controls" hx-swap-oob="true">' in changed
    assert ">Cancel run</button>" in changed
    assert 'id="work"' not in changed


@pytest.mark.django_db
def test_polled_partial_query_counts_are_pinned(django_assert_num_queries):
    client, membership = login("approver")
    run = force_status(
        submit_run(tenant=membership.tenant, kind="steps", input={"steps": 3}),
        "running",
        current_step="step1",
        steps_total=3,
    )
    Step.objects.create(run=run, seq=1, name="step1", status="running")
    run = fresh(run)

    quiet, moved, changed = poll_url(run), poll_url(run, seen="old"), poll_url(run, state="old")

    # session, user, memberships with their tenants, run, and its last step (what current_step names)
    with django_assert_num_queries(5):
        assert client.get(quiet, headers=HTMX).status_code == 200
    # ... and the steps, their artifacts and the activity's Events when the timeline moved
    with django_assert_num_queries(8):
        assert client.get(moved, headers=HTMX).status_code == 200
    # ... and the run's messages when its state changed (no pending step to look up while running)
    with django_assert_num_queries(6):
        assert client.get(changed, headers=HTMX).status_code == 200

    waiting = waiting_for_approval(membership.tenant)
    quiet, changed = poll_url(waiting), poll_url(waiting, state="old")
    # A run waiting for a person: the pending step and the messages on a state change.
    with django_assert_num_queries(7):
        assert client.get(changed, headers=HTMX).status_code == 200
    with django_assert_num_queries(5):
        assert client.get(quiet, headers=HTMX).status_code == 200


@pytest.mark.django_db
def test_the_step_timeline_shows_kind_duration_tokens_cost_payloads_and_artifacts(
    member_client, member, settings, tmp_path
):
    settings.MEDIA_ROOT = str(tmp_path)
    run = force_status(
        submit_run(tenant=member.tenant, kind="steps", input={"steps": 2}),
        "running",
        current_step="search",
    )
    started = timezone.now() - timedelta(seconds=3)
    step = Step.objects.create(
        run=run,
        seq=1,
        name="plan",
        kind="llm",
        status="done",
        input={"args": ["acme"]},
        output={"plan": ["search", XSS]},
        tokens_in=1200,
        tokens_out=340,
        cost_cents=Decimal("0.0384"),
        started_at=started,
        ended_at=started + timedelta(seconds=2.5),
    )
    Step.objects.create(
        run=run, seq=2, name="search", kind="tool", status="running", started_at=started
    )
    artifact = Artifact(
        run=run,
        step=step,
        name="page.html",
        content_type="text/html",
        size=12,
        sha256="0" * 64,
        summary="the fetched page",
    )
    artifact.file.save("page.html", ContentFile(b"<script>x</script>"), save=True)

    html = member_client.get(detail_url(run)).content.decode()

    assert '<strong class="step-name">plan</strong>' in html
    assert '<span class="tag">llm</span>' in html and '<span class="tag">tool</span>' in html
    assert "<span>2.5 s</span>" in html
    assert "<span>1200 in · 340 out tokens</span>" in html
    assert "<span>0.038¢</span>" in html  # two significant digits under a cent
    assert (
        '<details><summary>Input</summary><pre tabindex="0">{\n  &quot;args&quot;: [\n    &quot;acme&quot;'
        in html
    )
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and XSS not in html
    link = f"/runs/{run.id}/artifacts/{artifact.pk}/"
    assert f'<a href="{link}" download>page.html</a>' in html

    download = member_client.get(link)
    assert download.status_code == 200
    assert download["Content-Disposition"].startswith("attachment")
    assert download["Content-Type"] == "application/octet-stream"
    assert b"".join(download.streaming_content) == b"<script>x</script>"

    stranger = Client()
    stranger.force_login(MembershipFactory().user)
    assert stranger.get(link).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_executed_run_reports_done_with_its_result_and_steps(client):
    member = MembershipFactory()
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi", "times": 2})

    assert client.get(detail_url(run), headers=HTMX).status_code == 200
    run_worker_until_idle()
    assert fresh(run).status == "done"

    partial = client.get(detail_url(run), headers=HTMX)
    assert partial.status_code == 286
    html = partial.content.decode()
    assert 'data-testid="status">Done</span>' in html
    assert 'data-testid="current-step"' not in html  # a finished run has none
    assert '<dd data-testid="steps-done">1 step</dd>' in html
    assert (
        '<pre tabindex="0" class="result" data-testid="result">{\n  &quot;echo&quot;: &quot;hihi&quot;\n}</pre>'
        in html
    )
    # The step timeline comes with the poll that sees the run finish, so it grows without a reload.
    assert '<strong class="step-name">repeat</strong>' in html


@pytest.mark.django_db(transaction=True)
def test_an_approval_decided_on_the_page_lets_the_worker_finish(client):
    member = MembershipFactory(role="approver")
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="approve_then_act", input={})
    run_worker_until_idle()
    assert fresh(run).status == "waiting_human"

    html = client.get(detail_url(run)).content.decode()
    assert "Approval needed: update_crm" in html
    assert "&quot;stage&quot;: &quot;won&quot;" in html
    client.post(detail_url(run) + "approve/", {"comment": "go", "step": "2"})
    run_worker_until_idle()

    run = fresh(run)
    assert run.status == "done"
    assert run.result == {"applied": True, "comment": "go", "by": f"user:{member.user.pk}"}


@pytest.mark.django_db(transaction=True)
def test_failed_run_shows_its_error_with_what_to_do_and_stops_polling(client):
    member = MembershipFactory()
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="broken", input={})

    run_worker_until_idle()

    assert fresh(run).status == "failed"
    response = client.get(detail_url(run), headers=HTMX)
    assert response.status_code == 286
    html = response.content.decode()
    assert 'data-testid="status">Failed</span>' in html
    assert 'Why it stopped <span class="tag">fatal</span>' in html
    assert "the CRM rejected the record: field &#x27;email&#x27; is invalid" in html
    assert "Retrying the same input will fail the same way." in html
    # The Retry button arrives with the poll that saw the run fail.
    assert ">Retry</button>" in html


# Untrusted output is escaped


@pytest.mark.django_db(transaction=True)
def test_html_in_a_result_is_escaped(client):
    member = MembershipFactory()
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": XSS})

    run_worker_until_idle()

    assert fresh(run).result == {"echo": XSS}
    for response in (client.get(detail_url(run)), client.get(detail_url(run), headers=HTMX)):
        html = response.content.decode()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert XSS not in html
        assert "<script>alert" not in html


@pytest.mark.django_db
def test_html_in_an_error_and_in_a_step_name_is_escaped(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})
    force_status(
        run,
        "failed",
        finished_at=timezone.now(),
        error_kind="fatal",
        error='tool said: <img src=x onerror="alert(1)">',
        current_step=XSS,
    )
    run.steps.create(seq=1, name=XSS, status="failed")

    for response in (
        member_client.get(detail_url(run)),
        member_client.get(detail_url(run), headers=HTMX),
    ):
        html = response.content.decode()
        assert "<img" not in html
        assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
        assert "<script>alert" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


@pytest.mark.django_db
def test_html_in_a_proposal_is_shown_as_text_to_the_approver():
    client, membership = login("approver")
    run = waiting_for_approval(
        membership.tenant, proposal={"body": XSS, "<b>key</b>": "<img src=x onerror=1>"}
    )

    for response in (client.get(detail_url(run)), _poll(client, run, state="old")):
        html = response.content.decode()
        assert "<script>alert" not in html and "<img src" not in html and "<b>key" not in html
        assert "&quot;body&quot;: &quot;&lt;script&gt;alert(1)&lt;/script&gt;&quot;" in html
        assert "&quot;&lt;b&gt;key&lt;/b&gt;&quot;: &quot;&lt;img src=x onerror=1&gt;&quot;" in html


def test_presenters_word_money_and_durations():
    assert [presenters.money(c) for c in (0, Decimal("0.004"), Decimal("2.345"), 1240, None)] == [
        "0¢",
        "0.004¢",
        "2.35¢",
        "$12.40",
        "—",
    ]
    assert [presenters.duration(s) for s in (0.42, 12, 185, 7380, None)] == [
        "0.4 s",
        "12 s",
        "3 min 05 s",
        "2 h 03 min",
        "—",
    ]
