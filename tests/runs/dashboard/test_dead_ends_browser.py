"""No dead ends: a page that is not there, a user who belongs to no tenant, logging out.

Each says what happened and offers a way on (back to the runs, log out, log
in again), for anonymous and signed-in people alike, and reads at 1280 and
390 px (screenshots under docs/screenshots/). DEBUG is off in the test
session, as in production, so these are the pages people get.
"""

from __future__ import annotations

import re
import uuid

import pytest
from django.template.loader import render_to_string
from django.test import Client, RequestFactory

from runs.models import Run
from tests.support import run_states
from tests.support.browser import (
    assert_accessible,
    assert_no_horizontal_scroll,
    browser_page,
    log_in,
    screenshots,
)
from tests.support.factories import MembershipFactory, UserFactory

NO_TENANT = "You are signed in as Ana Lopez but not a member of any tenant yet: ask an administrator to add you to one."


# --- without a browser: the answers and their words ------------------------------------


@pytest.mark.django_db
def test_page_not_found_says_ours_and_never_a_resolver_dump(client):
    member = MembershipFactory()
    client.force_login(member.user)

    missing_run = client.get(f"/runs/{uuid.uuid4()}/")
    assert missing_run.status_code == 404
    assert "Run not found." in missing_run.content.decode()
    nowhere = client.get("/no/such/page/")
    assert nowhere.status_code == 404
    page = nowhere.content.decode()
    assert "There is nothing at this address." in page
    assert "Resolver404" not in page and "tried" not in page and "urlpatterns" not in page
    assert 'action="/accounts/logout/"' in page and 'href="/"' in page

    anonymous = Client().get("/no/such/page/")
    assert anonymous.status_code == 404
    assert 'href="/accounts/login/"' in anonymous.content.decode()
    assert "Log out" not in anonymous.content.decode()


@pytest.mark.django_db
def test_a_user_without_a_tenant_is_refused_with_a_reason_before_any_run_is_looked_up(client):
    client.force_login(UserFactory(first_name="Ana", last_name="Lopez"))
    run = run_states.waiting_for_approval(MembershipFactory().tenant)

    for response in (
        client.get("/"),
        client.get(f"/runs/{run.id}/"),
        client.get(f"/runs/{uuid.uuid4()}/"),
        client.post(f"/runs/{run.id}/approve/", {"step": "2"}),
    ):
        assert response.status_code == 403
        assert NO_TENANT in re.sub(
            r"</?strong>", "", response.content.decode()
        )  # the page of its own
    assert Run.objects.get(pk=run.pk).status == "waiting_human"


@pytest.mark.django_db
def test_the_no_tenant_page_names_the_user_and_offers_to_log_out():
    request = RequestFactory().get("/")
    request.user = UserFactory(username="ana", first_name="Ana", last_name="Lopez")

    page = render_to_string("no_membership.html", request=request)

    assert NO_TENANT in re.sub(r"</?strong>", "", page)
    assert 'action="/accounts/logout/"' in page and "csrfmiddlewaretoken" in page


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "again"),
    [
        ("/accounts/logout/", '<a class="button" href="/accounts/login/">Log in again</a>'),
        (
            "/admin/logout/",
            '<a class="button" href="/admin/login/">Log in to the operations console again</a>',
        ),
    ],
)
def test_logging_out_says_so_and_offers_to_log_in_again(client, settings, path, again):
    settings.LOGOUT_REDIRECT_URL = None  # what config/settings.py is to say (see the browser test)
    client.force_login(UserFactory(is_staff=True))

    response = client.post(path)

    assert response.status_code == 200
    assert "You are logged out." in response.content.decode() and again in response.content.decode()
    assert "_auth_user_id" not in client.session


# --- in a browser --------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_wrong_run_id_says_so_and_leads_back_to_the_runs(live_server, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", user__username="ana")
    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username)
        response = page.goto(f"{live_server.url}/runs/{uuid.uuid4()}/")
        assert response.status == 404
        expect(page.get_by_role("heading", level=1)).to_have_text("Page not found")
        expect(page.get_by_test_id("not-found")).to_have_text("Run not found.")
        expect(page.get_by_role("button", name="Log out", exact=True)).to_be_visible()
        screenshots(page, "page-not-found")
        assert_accessible(page)

        page.get_by_role("link", name="Back to the runs").click()
        expect(page).to_have_url(live_server.url + "/")
        expect(page.get_by_test_id("tenant")).to_have_text("Acme Research")

        # An address that matches nothing reads the same way, signed out too.
        page.goto(f"{live_server.url}/runs/not-a-run/")
        expect(page.get_by_test_id("not-found")).to_have_text("There is nothing at this address.")
        page.get_by_role("button", name="Log out", exact=True).click()
        response = page.goto(f"{live_server.url}/no/such/page/")
        assert response.status == 404
        expect(page.get_by_test_id("not-found")).to_have_text("There is nothing at this address.")
        expect(page.get_by_role("button", name=re.compile("^Log out"))).to_have_count(0)
        assert_accessible(page)
        page.get_by_role("link", name="Log in").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("Log in")


@pytest.mark.django_db(transaction=True)
def test_a_user_without_a_tenant_is_told_why_and_can_log_out(live_server, chromium, settings):
    from playwright.sync_api import expect

    # Django's LogoutView shows registration/logged_out.html when there is no redirect after it.
    settings.LOGOUT_REDIRECT_URL = None
    user = UserFactory(username="ana", first_name="Ana", last_name="Lopez")
    request = RequestFactory().get("/")
    request.user = user
    dedicated = render_to_string("no_membership.html", request=request)
    with browser_page(chromium) as page:
        log_in(page, live_server.url, user.username)
        expect(page.get_by_role("main")).to_contain_text(NO_TENANT)
        response = page.reload()
        assert response.status == 403
        screenshots(page, "no-membership")
        assert_accessible(page)

        page.get_by_role("button", name=re.compile("^Log out")).first.click()
        expect(page.get_by_test_id("logged-out")).to_have_text("You are logged out.")
        expect(page.get_by_role("button", name=re.compile("^Log out"))).to_have_count(0)
        screenshots(page, "logged-out")
        assert_accessible(page)

        page.get_by_role("link", name="Log in again").click()
        expect(page).to_have_url(re.compile(r"/accounts/login/$"))
        expect(page.get_by_role("heading", level=1)).to_have_text("Log in")
        screenshots(page, "log-in")
        assert_accessible(page)
        # Logged out for real: the dashboard asks to log in again.
        page.goto(live_server.url + "/")
        expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))

        # The page of its own (templates/no_membership.html), once the 403 handler renders it.
        page.set_content(
            dedicated.replace('href="/static/', f'href="{live_server.url}/static/'),
            wait_until="load",
        )
        expect(page.get_by_test_id("no-membership")).to_have_text(NO_TENANT)
        for width in (1280, 390):
            page.set_viewport_size({"width": width, "height": 800})
            assert_no_horizontal_scroll(page)
        assert_accessible(page)
