"""The operations console in a real browser: every page fits a phone and shows its key columns at 1280 px.

Debian's Chromium through Playwright (tests/support/browser.py, which says why the
data is written before the browser opens). Each page is saved at 1280 and
390 px as docs/screenshots/admin-<page>.png and admin-<page>-phone.png, and
neither may scroll sideways. The last tests check, without a browser, what
a confirmation page carries to the decision.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from runs.dashboard.presenters import money
from runs.keys import create_api_key
from runs.models import Event, Run, Step, WebhookDelivery, WebhookEndpoint, Worker
from tests.conftest import fresh
from tests.support.admin_helpers import add_steps, make_run, messages_of
from tests.support.browser import (
    DESKTOP,
    PHONE,
    assert_no_horizontal_scroll,
    browser_page,
    screenshots,
)
from tests.support.factories import MembershipFactory, TenantFactory, UserFactory

BROWSER = pytest.mark.django_db(transaction=True)  # the live server reads what the test wrote

XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'
CRM_PROPOSAL = {
    "summary": "Mark the Globex deal as won",
    "target": "crm://deals/4711",
    "changes": [
        {"field": "stage", "before": "negotiation", "after": "won"},
        {"field": "amount", "before": 12000, "after": 12500},
    ],
}


def admin_log_in(page, base_url: str, user) -> None:
    page.goto(base_url + "/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(user.username)
    page.get_by_label("Password").fill("secret-pass")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(base_url + "/admin/")


def awaiting_approval(tenant, proposal, *, name: str = "update_crm") -> Run:
    run = make_run(
        tenant, "waiting_human", kind="approve_then_act", current_step=name, steps_done=1, attempt=1
    )
    Step.objects.create(
        run=run, seq=1, name="draft", kind="tool", status="done", output={"draft": True}
    )
    Step.objects.create(
        run=run, seq=2, name=name, kind="approval", status="waiting", input={"proposal": proposal}
    )
    return run


@pytest.fixture
def console(tenant):
    """A superuser, and a console with something on every page: runs in several states, workers, keys."""
    user = UserFactory(is_staff=True, is_superuser=True)
    other = TenantFactory(
        slug="globex-research-and-development", name="Globex Research & Development"
    )
    now = timezone.now()
    runs = {
        "queued": make_run(tenant, "queued"),
        "running": make_run(
            other,
            "running",
            kind="approve_then_act",
            current_step="draft",
            steps_total=4,
            steps_done=1,
            cost_cents="0.004213",
        ),
        "done": make_run(
            tenant,
            "done",
            cost_cents="1234.5",
            started_at=now - timedelta(minutes=3),
            finished_at=now - timedelta(minutes=2),
            steps_done=3,
            steps_total=3,
        ),
        "failed": make_run(
            other,
            "failed",
            error_kind="fatal",
            error="the CRM said no",
            cost_cents="1.096920",
            finished_at=now - timedelta(minutes=20),
        ),
        "approval": awaiting_approval(tenant, CRM_PROPOSAL),
        "hostile": awaiting_approval(other, {"note": XSS, "amount": 42}, name="pay"),
    }
    add_steps(runs["done"], 3)
    add_steps(runs["failed"], 2)
    for minutes in (4, 9, 14, 31, 33, 47):
        make_run(tenant, "done", finished_at=now - timedelta(minutes=minutes))
    make_run(other, "failed", error_kind="retryable", finished_at=now - timedelta(minutes=9))
    Worker.objects.create(
        host="worker-a.internal", pid=4121, concurrency=8, runs_held=3, queues=["default", "long"]
    )
    Worker.objects.create(
        host="worker-b.internal", pid=77, concurrency=4, last_seen_at=now - timedelta(hours=1)
    )
    create_api_key(tenant=tenant, name="billing integration")
    MembershipFactory(tenant=tenant, role="approver")
    WebhookEndpoint.objects.create(
        tenant=tenant,
        url="https://hooks.example.com/agent-runs/callback?source=prod",
        description="billing system: every finished run",
    )
    event = Event.objects.filter(run=runs["done"]).order_by("seq").first()
    WebhookDelivery.objects.create(
        event=event,
        run=runs["done"],
        tenant=tenant,
        url="https://hooks.example.com/agent-runs/callback?source=prod",
        event_type="run.done",
        webhook_id="msg_2Yh0c3Vx",
        status="dead",
        attempts=12,
        response_code=502,
        last_error="502 Bad Gateway from the receiver after 10 s",
    )
    return user, runs


def key_columns_shown(page, *names: str) -> None:
    """At 1280 px the list's table fits its box (no inner scroll) and these headers are on screen."""
    page.set_viewport_size(DESKTOP)
    box = page.locator("#changelist-form .results")
    inner, outer = box.evaluate("e => [e.scrollWidth, e.clientWidth]")
    if inner > outer:
        widths = page.evaluate(
            "() => [...document.querySelectorAll('#result_list thead th')]"
            ".map(e => e.className + ': ' + Math.round(e.getBoundingClientRect().width))"
        )
        raise AssertionError(f"{page.url}: the list is {inner}px wide in a {outer}px box: {widths}")
    limit = box.evaluate("e => e.getBoundingClientRect().right")
    for name in names:
        header = page.locator("#result_list thead th", has_text=name).first
        assert header.is_visible(), f"{page.url}: no visible column {name!r}"
        assert header.evaluate("e => e.getBoundingClientRect().right") <= limit + 1


@BROWSER
def test_every_console_page_fits_a_phone_and_shows_its_key_columns(live_server, chromium, console):
    from playwright.sync_api import expect

    user, runs = console
    url = live_server.url
    step_id = Step.objects.filter(run=runs["done"]).values_list("pk", flat=True).first()
    with browser_page(chromium, **DESKTOP) as page:
        admin_log_in(page, url, user)

        # The index: the Operations module reads like the app modules, its link a word, not a column of letters.
        overview_link = page.locator("#runs-operations").get_by_role("link", name="Overview")
        expect(overview_link).to_be_visible()
        screenshots(page, "admin-index")
        page.set_viewport_size(PHONE)
        assert overview_link.bounding_box()["width"] > 40
        page.set_viewport_size(DESKTOP)

        page.goto(url + "/admin/runs/run/")
        expect(page.locator("#result_list")).to_be_visible()
        key_columns_shown(page, "Run", "Kind", "Tenant", "Status", "Cost", "Created", "Finished")
        done_row = page.locator("#result_list tr", has_text=str(runs["done"].pk)[:8])
        failed_row = page.locator("#result_list tr", has_text=str(runs["failed"].pk)[:8])
        # Money as the dashboard words it (runs.dashboard.presenters.money), not "1.096920".
        expect(done_row.locator(".field-cost")).to_have_text("$12.35")
        expect(failed_row.locator(".field-cost")).to_have_text(money(Decimal("1.096920")))
        expect(done_row.locator(".field-created time")).to_have_text(
            timezone.localtime(runs["done"].created_at).strftime("%Y-%m-%d %H:%M:%S")
        )
        expect(failed_row.locator(".field-status_column")).to_have_text("Failed (fatal)")
        screenshots(page, "admin-runs")

        page.goto(f"{url}/admin/runs/run/{runs['done'].pk}/change/")
        dashboard = page.get_by_role("link", name="View on the dashboard")
        expect(dashboard).to_have_attribute("href", f"/runs/{runs['done'].pk}/")
        expect(page.locator(".field-cost .readonly")).to_have_text("$12.35")
        expect(page.locator(".field-finished .readonly")).to_have_text(
            timezone.localtime(runs["done"].finished_at).strftime("%Y-%m-%d %H:%M:%S")
        )
        screenshots(page, "admin-run")

        page.goto(url + "/admin/runs/run/overview/")
        chart = page.locator("svg.ops-chart")
        expect(page.locator("ol.breadcrumbs")).to_contain_text("Operations overview")
        expect(
            page.get_by_role("img", name="Runs finished per 5 minutes over the last hour")
        ).to_be_visible()
        labels = chart.locator("text").all_text_contents()
        assert "runs" in labels and any(label.startswith("finished at") for label in labels)
        assert "0" in labels and any(":" in label for label in labels), (
            labels
        )  # the y ticks and the times
        assert chart.locator("rect.done").count() == 12
        screenshots(page, "admin-overview")

        for name, path, columns in [
            ("tenants", "/admin/runs/tenant/", ("Slug", "Running", "Cost today", "Daily cap")),
            (
                "apikeys",
                "/admin/runs/apikey/",
                ("Name", "Tenant", "Created", "Last used", "Revoked"),
            ),
            ("memberships", "/admin/runs/membership/", ("User", "Tenant", "Role")),
            (
                "workers",
                "/admin/runs/worker/",
                ("Worker", "Host", "State", "Runs held", "Last seen"),
            ),
            (
                "deliveries",
                "/admin/runs/webhookdelivery/",
                ("Event type", "Run", "Status", "Url", "Last answer", "Created"),
            ),
            ("steps", "/admin/runs/step/", ("Run", "Name", "Status", "Cost", "Ended")),
        ]:
            page.goto(url + path)
            expect(page.locator("#result_list")).to_be_visible()
            key_columns_shown(page, *columns)
            screenshots(page, f"admin-{name}")

        page.goto(url + "/admin/runs/membership/add/")
        screenshots(page, "admin-membership-add")

        # The other pages reachable from the index only need to fit a phone.
        for path in [
            "/admin/runs/queue/",
            "/admin/runs/kindstate/",
            "/admin/runs/webhookendpoint/",
            "/admin/runs/webhookendpoint/add/",
            f"/admin/runs/tenant/{runs['done'].tenant_id}/change/",
            "/admin/runs/apikey/add/",
            f"/admin/runs/run/{runs['approval'].pk}/change/",
            f"/admin/runs/step/{step_id}/change/",
            "/admin/auth/user/",
            "/admin/crm/lead/",
            "/admin/crm/leadupdate/",
            "/admin/deploys/resource/",
        ]:
            page.goto(url + path)
            for size in (DESKTOP, PHONE):
                page.set_viewport_size(size)
                assert_no_horizontal_scroll(page)


@BROWSER
def test_bulk_approve_shows_each_proposal_as_text_before_deciding(live_server, chromium, console):
    from playwright.sync_api import expect

    user, runs = console
    with browser_page(chromium, **DESKTOP) as page:
        admin_log_in(page, live_server.url, user)
        page.goto(live_server.url + "/admin/runs/run/?status__exact=waiting_human")
        page.locator("#action-toggle").check()
        page.locator("select[name=action]").select_option("approve_runs")
        page.locator("button[name=index]").click()

        expect(page.get_by_role("heading", name="Approve these proposals?")).to_be_visible()
        crm = page.get_by_test_id("confirm-run").filter(has_text=str(runs["approval"].pk)[:8])
        expect(crm).to_contain_text("Step 2, update_crm, proposes:")
        expect(crm.get_by_test_id("proposal")).to_contain_text("Mark the Globex deal as won")
        expect(crm.get_by_test_id("proposal")).to_contain_text("crm://deals/4711")
        changes = crm.locator("table.runs-changes tbody tr")
        expect(changes).to_have_count(2)
        expect(changes.first.locator("th, td")).to_have_text(["Stage", "negotiation", "won"])
        hostile = page.get_by_test_id("confirm-run").filter(has_text=str(runs["hostile"].pk)[:8])
        expect(hostile.get_by_test_id("proposal")).to_contain_text(XSS)  # shown as text, never run
        assert page.evaluate("window.__xss") is None
        screenshots(page, "admin-approve-confirm")

        page.get_by_role("button", name="Yes, approve").click()
        expect(page.locator(".messagelist")).to_contain_text("Approved 2 runs.")

    assert fresh(runs["approval"]).status == "queued"
    assert Step.objects.get(run=runs["approval"], seq=2).output["approved"] is True


@BROWSER
def test_bulk_cancel_asks_first(live_server, chromium, console):
    from playwright.sync_api import expect

    user, runs = console
    with browser_page(chromium, **DESKTOP) as page:
        admin_log_in(page, live_server.url, user)
        page.goto(live_server.url + "/admin/runs/run/")
        for state in ("queued", "running"):
            page.locator("#result_list tr", has_text=str(runs[state].pk)[:8]).locator(
                "input.action-select"
            ).check()
        page.locator("select[name=action]").select_option("cancel_runs")
        page.locator("button[name=index]").click()

        expect(page.get_by_role("heading", name="Cancel these runs?")).to_be_visible()
        expect(page.get_by_test_id("confirm-run")).to_have_count(2)
        screenshots(page, "admin-cancel-confirm")
        page.get_by_role("link", name="No, take me back").click()
        expect(page.locator("#result_list")).to_be_visible()

        # The single-run forms (retry or fork from a step, resolve) share the confirmation pages' look.
        page.locator("#result_list tr", has_text=str(runs["failed"].pk)[:8]).locator(
            "input.action-select"
        ).check()
        page.locator("select[name=action]").select_option("retry_from_step")
        page.locator("button[name=index]").click()
        expect(page.locator("ol.breadcrumbs")).to_contain_text("Retry from a step")
        screenshots(page, "admin-retry-from-step")

    assert fresh(runs["queued"]).status == "queued"


@BROWSER
def test_a_membership_is_given_with_a_user_search_and_described_roles(
    live_server, chromium, console, tenant
):
    from playwright.sync_api import expect

    user, _ = console
    member = UserFactory(username="dana.operator")
    with browser_page(chromium, **DESKTOP) as page:
        admin_log_in(page, live_server.url, user)
        page.goto(live_server.url + "/admin/runs/membership/add/")

        roles = page.locator(".field-role")
        expect(roles).to_contain_text("Viewer: reads the tenant's runs, steps and results")
        expect(roles).to_contain_text(
            "Operator: also submits, cancels, pauses, resumes, retries and sends messages"
        )
        expect(roles).to_contain_text("Approver: also approves, rejects and resolves")

        # The user is found by typing (an autocomplete), not by a raw id.
        page.locator(".field-user .select2-selection").click()
        page.locator(".select2-search__field").fill("dana")
        page.get_by_role("option", name="dana.operator").click()
        page.locator(".field-tenant .select2-selection").click()
        page.locator(".select2-search__field").fill(tenant.slug)
        page.get_by_role("option", name=str(tenant)).click()
        page.get_by_label("Operator: also submits").check()
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator(".messagelist")).to_contain_text("was added successfully")

    assert member.memberships.get().role == "operator"


# The confirmation pages without a browser: what they carry to the decision


@pytest.mark.django_db
def test_an_approval_decides_the_step_it_showed_not_a_later_one(admin_client, tenant):
    run = awaiting_approval(tenant, CRM_PROPOSAL)
    selected = {"action": "approve_runs", "_selected_action": [str(run.pk)]}

    page = admin_client.post("/admin/runs/run/", selected).content.decode()
    assert f'name="step-{run.pk}" value="2"' in page
    # Meanwhile the run was approved elsewhere and now waits on another proposal.
    Step.objects.filter(run=run, seq=2).update(status="done", output={"approved": True})
    Step.objects.create(
        run=run,
        seq=3,
        name="send_invoice",
        kind="approval",
        status="waiting",
        input={"proposal": {"summary": "Invoice Globex"}},
    )

    response = admin_client.post(
        "/admin/runs/run/", {**selected, f"step-{run.pk}": "2", "apply": "1"}
    )

    assert messages_of(response) == [
        "Skipped 1 run: step 2 is not the pending approval (step 3 is)."
    ]
    assert fresh(run).status == "waiting_human"
    assert Step.objects.get(run=run, seq=3).status == "waiting"


@pytest.mark.django_db
def test_a_confirmed_cancel_keeps_select_all_but_a_decision_covers_only_the_runs_listed(
    admin_client, tenant
):
    runs = [awaiting_approval(tenant, {"summary": f"change {i}"}) for i in range(3)]
    across = {"_selected_action": [str(runs[0].pk)], "select_across": "1", "index": "0"}

    cancel = admin_client.post(
        "/admin/runs/run/?status__exact=waiting_human", {"action": "cancel_runs", **across}
    )
    approve = admin_client.post(
        "/admin/runs/run/?status__exact=waiting_human", {"action": "approve_runs", **across}
    )

    assert b'name="select_across" value="1"' in cancel.content
    assert b'name="select_across"' not in approve.content
    for run in runs:
        assert f'name="_selected_action" value="{run.pk}"'.encode() in approve.content
        assert f"change {runs.index(run)}".encode() in approve.content
    assert {fresh(run).status for run in runs} == {"waiting_human"}
