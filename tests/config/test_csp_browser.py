"""The Content-Security-Policy (issue 25): every page sends it, and the dashboard, htmx and the admin work
under it without one violation, in a real browser against a real `manage.py serve` process.

Debian's Chromium through Playwright (tests/support/browser.py). Violations are collected two ways: the page's
``securitypolicyviolation`` events (reported to the test through an exposed function, which the policy
cannot block) and the console's "Refused to ..." lines.
"""

from __future__ import annotations

import os
import re

import pytest

import tests.support.agents_dashboard  # noqa: F401  (its kinds, for the worker and the web process)
from runs.dashboard.rendering import markdown_html
from runs.services import submit_run
from tests.support.browser import browser, log_in
from tests.support.factories import MembershipFactory, UserFactory
from tests.support.web import Web

REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => window.reportViolation(
  `${location.pathname}: ${e.violatedDirective} refused ${e.blockedURI || "inline"} at ${e.sourceFile}:${e.lineNumber}`
  + ` (${e.sample})`));
"""

# What a browser does when its tab is hidden or shown again (headless Chromium's tab is always visible).
SET_VISIBILITY = """(state) => {
  Object.defineProperty(document, "visibilityState", {value: state, configurable: true});
  document.dispatchEvent(new Event("visibilitychange"));
}"""


class Watched:
    """A page whose CSP violations, console refusals and document responses' policies are recorded."""

    def __init__(self, context):
        self.violations: list[str] = []
        self.policies: dict[str, str | None] = {}
        self.page = context.new_page()
        self.page.set_default_timeout(15_000)
        self.page.expose_function("reportViolation", lambda text: self.violations.append(text))
        self.page.add_init_script(REPORT_VIOLATIONS)
        self.page.on("console", self._console)
        self.page.on("response", self._response)

    def _console(self, message) -> None:
        if "Refused to" in message.text or "Content Security Policy" in message.text:
            self.violations.append(f"console: {message.text}")

    def _response(self, response) -> None:
        if response.request.resource_type == "document":
            self.policies[response.url] = response.headers.get("content-security-policy")


def modules() -> str:
    return ",".join(
        filter(None, [os.environ.get("AGENT_MODULES", ""), "tests.support.agents_dashboard"])
    )


@pytest.mark.django_db(transaction=True)
def test_the_dashboard_and_the_admin_work_under_the_policy_without_a_violation(processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", role="operator")
    admin = UserFactory(is_staff=True, is_superuser=True)
    MembershipFactory(user=admin, tenant=member.tenant)
    live = submit_run(tenant=member.tenant, kind="steps", input={"steps": 90, "step_seconds": 1})
    web = Web(processes, AGENT_MODULES=modules()).start()
    processes.worker("--heartbeat", "1", "--poll", "0.3", AGENT_MODULES=modules())
    base = web.base

    with browser(chromium) as instance:
        watched = Watched(instance.new_context(viewport={"width": 1280, "height": 800}))
        page = watched.page
        log_in(page, base, member.user.username)  # the login page, then the run list
        list_poll = re.compile(rf"{re.escape(base)}/(\?.*)?$")
        polls: list[str] = []
        page.on(
            "request",
            lambda r: (
                polls.append(r.url)
                if r.headers.get("hx-request") and list_poll.match(r.url)
                else None
            ),
        )
        with page.expect_response(
            lambda r: list_poll.match(r.url) and r.request.headers.get("hx-request") == "true"
        ):
            pass  # the list polls while a run is live ...
        # ... not while the tab is hidden (static/js/poll.js), and at once when it shows again.
        page.evaluate(SET_VISIBILITY, "hidden")
        polls.clear()
        page.wait_for_timeout(4_500)
        assert polls == []  # two poll intervals passed without one: behaviour, not a wait
        with page.expect_response(
            lambda r: list_poll.match(r.url) and r.request.headers.get("hx-request") == "true"
        ):
            page.evaluate(SET_VISIBILITY, "visible")

        # The New run form, then the run page following the run live (its event stream, htmx refreshes).
        page.get_by_role("main").get_by_role("link", name="New run").click()
        page.get_by_role("link", name="steps", exact=True).click()
        page.get_by_label("Steps", exact=True).fill("3")
        page.get_by_label("Step Seconds").fill("1")
        with page.expect_request(lambda r: "/events" in r.url, timeout=30_000):
            page.get_by_role("button", name="Submit run").click()
        expect(page).to_have_url(re.compile(rf"{re.escape(base)}/runs/[0-9a-f-]{{36}}/$"))
        page.evaluate("window.__notReloaded = true")
        expect(page.get_by_test_id("status")).to_have_text("Done", timeout=30_000)
        expect(page.get_by_test_id("steps-done")).to_have_text("3 of 3")
        assert page.evaluate("window.__notReloaded === true")  # updated in place, not reloaded
        # A run still running: its confirmation dialog (static/js/confirm.js) opens, and is left.
        page.goto(f"{base}/runs/{live.pk}/")
        expect(page.get_by_test_id("status")).to_have_text("Running", timeout=30_000)
        page.get_by_role("button", name="Cancel run").click()
        expect(page.locator("#confirm-dialog")).to_be_visible()
        page.get_by_role("button", name="Go back").click()
        expect(page.locator("#confirm-dialog")).to_be_hidden()

        admin_page = Watched(instance.new_context(viewport={"width": 1280, "height": 800}))
        page = admin_page.page
        page.goto(f"{base}/admin/login/?next=/admin/")
        page.get_by_label("Username").fill(admin.username)
        page.get_by_label("Password").fill("secret-pass")
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{base}/admin/")
        page.goto(f"{base}/admin/runs/run/")
        page.goto(f"{base}/admin/runs/run/{live.pk}/change/")
        expect(page.locator("#content h1").first).to_be_visible()
        with page.expect_response(lambda r: "panel=" in r.url and r.status == 200, timeout=20_000):
            page.goto(f"{base}/admin/runs/run/overview/")  # its panels poll with htmx
        page.goto(f"{base}/admin/runs/apikey/add/")
        page.get_by_label("Name").fill("csp-check")
        page.locator(".select2-selection").first.click()  # the tenant's autocomplete (select2)
        page.locator(".select2-search__field").fill(member.tenant.slug)
        page.locator(".select2-results__option", has_text=member.tenant.slug).click()
        page.get_by_role("button", name="Save", exact=True).click()
        expect(page.locator("#api-key-secret")).to_have_text(re.compile(r"^ak_"))
        expect(page.locator("#api-key-secret")).to_have_css(
            "user-select", "all"
        )  # the style moved to CSS

    policies = {**watched.policies, **admin_page.policies}
    assert len(policies) >= 8, policies
    for url, policy in policies.items():
        assert policy and "script-src 'self'" in policy and "style-src 'self'" in policy, (
            url,
            policy,
        )
        assert "unsafe" not in policy, (url, policy)
    violations = watched.violations + admin_page.violations
    assert violations == [], "\n".join(violations)


def test_markdown_tables_align_with_classes_not_style_attributes():
    html = markdown_html("| a | b |\n|:-:|--:|\n| 1 | 2 |")
    assert "style=" not in html
    assert '<th class="align-center">a</th>' in html and '<td class="align-right">2</td>' in html
