"""The dashboard in a real browser, following runs executed by real worker processes.

Debian's Chromium through Playwright, set up by tests/support/browser.py (which
says why each test writes its data before it opens the browser). The tests
save the screenshots shown in the README under docs/screenshots/.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

import tests.support.agents_dashboard  # noqa: F401  (registers support_reply in the live server)
from runs.control import cancel_run, pause_run
from runs.models import Event, Run, Step
from runs.services import SYSTEM, submit_run
from tests.conftest import fresh
from tests.support.browser import (
    assert_accessible,
    browser_page,
    log_in,
    screenshot,
    screenshots,
)  # noqa: F401
from tests.support.factories import MembershipFactory
from tests.support.waiting import wait_until

REPLY = {
    "customer": "ana@example.com",
    "order": "A-1001",
    "message": "My kettle arrived broken. Refund?",
}
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def start_worker(processes, *, hold_file: Path | None = None):
    """A long-lived worker (not --burst: approved runs come back to the queue) that knows support_reply."""
    modules = ",".join(
        filter(None, [os.environ.get("AGENT_MODULES", ""), "tests.support.agents_dashboard"])
    )
    env = {"AGENT_MODULES": modules}
    if hold_file is not None:
        env["DASHBOARD_HOLD_FILE"] = str(hold_file)
    return processes.worker("--heartbeat", "1", "--poll", "0.5", **env)


def wait_status(run: Run, status: str, worker, processes, timeout: float = 30) -> Run:
    def reached():
        assert worker.poll() is None, processes.output(worker)
        return fresh(run).status == status

    wait_until(reached, timeout=timeout, what=f"run {run.id} to be {status}")
    return fresh(run)


@pytest.mark.django_db(transaction=True)
def test_submit_through_the_form_and_watch_the_run_finish_without_reloading(
    live_server, processes, chromium
):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", role="operator")
    worker = start_worker(processes)

    requests: list[tuple[float, str]] = []
    navigations: list[str] = []
    with browser_page(chromium) as page:
        page.on("request", lambda request: requests.append((time.monotonic(), request.url)))
        log_in(page, live_server.url, member.user.username)
        expect(page.get_by_test_id("tenant")).to_have_text("Acme Research")

        # The submit form is built from the kind's input schema.
        page.get_by_role("main").get_by_role("link", name="New run").click()
        page.get_by_role("link", name="steps", exact=True).click()
        page.get_by_label("Steps", exact=True).fill("4")
        page.get_by_label("Step Seconds").fill("1")
        page.get_by_role("button", name="Submit run").click()

        # It answers at once with the new run's page.
        expect(page).to_have_url(re.compile(rf"{live_server.url}/runs/[0-9a-f-]{{36}}/$"))
        run_path = page.url.removeprefix(live_server.url)
        expect(page.get_by_role("status")).to_have_text("Run submitted.")
        page.on(
            "framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
        )
        # A marker that a reload would wipe out.
        page.evaluate("window.__notReloaded = true")

        status = page.get_by_test_id("status")
        # Polling shows the run while it runs (4 steps of 1 s, polled every 2 s) ...
        expect(status).to_have_text("Running", timeout=30_000)
        expect(page.get_by_test_id("current-step")).to_contain_text("step")
        # ... and then done, with every step counted and the timeline complete.
        expect(status).to_have_text("Done", timeout=30_000)
        done_at = time.monotonic()
        expect(page.get_by_test_id("steps-done")).to_have_text("4 of 4")
        expect(page.locator("progress")).to_have_attribute("value", "4")
        expect(page.get_by_test_id("result")).to_contain_text('"steps": 4')
        steps = page.get_by_test_id("step")
        expect(steps).to_have_count(4)
        expect(steps.locator(".step-name")).to_have_text([f"step{n}" for n in range(1, 5)])
        expect(steps.locator(".badge")).to_have_text(["Done"] * 4)
        # The Retry button is not offered for a run that succeeded; Cancel is gone.
        expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)

        assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"
        assert navigations == []

        # The 286 answer stopped polling: no request to the run page afterwards. These 5 s without
        # one are the behaviour under test, not a wait for something.
        page.wait_for_timeout(5_000)
        polls_after_done = [url for at, url in requests if at > done_at and run_path in url]
        assert polls_after_done == []
        polls_before_done = [url for at, url in requests if at <= done_at and run_path in url]
        assert len(polls_before_done) >= 3  # the page itself, then at least two polls

    run = Run.objects.get(tenant=member.tenant)
    assert run.status == "done"
    assert run.steps_done == 4
    first = Event.objects.get(run=run, seq=1)
    assert (first.actor_type, first.actor_id) == ("user", str(member.user.pk))
    assert worker.poll() is None, processes.output(worker)


@pytest.mark.django_db(transaction=True)
def test_approve_one_waiting_run_and_reject_another(live_server, processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Support", role="approver")
    worker = start_worker(processes)
    approved = submit_run(tenant=member.tenant, kind="support_reply", input=REPLY)
    rejected = submit_run(
        tenant=member.tenant, kind="support_reply", input={**REPLY, "order": "A-1002"}
    )
    wait_status(approved, "waiting_human", worker, processes)
    wait_status(rejected, "waiting_human", worker, processes)

    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username)
        # The list counts the runs waiting for this approver and links to them.
        waiting = page.get_by_test_id("waiting-count")
        expect(waiting).to_have_text("2 runs wait for your approval →")
        waiting.get_by_role("link").click()
        expect(page).to_have_url(live_server.url + "/?status=waiting_human")
        expect(page.locator("table.runs-table tbody tr")).to_have_count(2)

        page.locator(f'a[href="/runs/{approved.id}/"]').click()
        card = page.get_by_test_id("approval")
        expect(card.get_by_role("heading")).to_have_text("Approval needed: send_reply")
        expect(card.get_by_test_id("proposal")).to_contain_text("ana@example.com")
        expect(page.get_by_test_id("status")).to_have_text("Needs a person")
        assert_accessible(page)
        screenshots(page, "run-waiting-for-approval")

        card.get_by_label("Comment").fill("Refund is fine.")
        card.get_by_role("button", name="Approve").click()
        expect(page.get_by_role("status")).to_have_text("Approved: the run continues.")
        expect(page.get_by_test_id("approval")).to_have_count(0)
        expect(page.get_by_test_id("status")).to_have_text("Done", timeout=30_000)
        expect(page.get_by_test_id("result")).to_contain_text('"sent": true')

        page.goto(f"{live_server.url}/runs/{rejected.id}/")
        card = page.get_by_test_id("approval")
        card.get_by_label("Comment").fill("Wrong tone.")
        card.get_by_role("button", name="Reject").click()
        page.locator("#confirm-dialog").get_by_role(
            "button", name="Reject"
        ).click()  # it asks first
        expect(page.get_by_role("status")).to_have_text("Rejected: the run continues without it.")
        expect(page.get_by_test_id("status")).to_have_text("Done", timeout=30_000)
        expect(page.get_by_test_id("result")).to_contain_text('"sent": false')

    assert fresh(approved).result == {
        "sent": True,
        "refund_eur": 50.0,
        "comment": "Refund is fine.",
    }
    assert fresh(rejected).result == {"sent": False, "comment": "Wrong tone."}
    # Only the approved reply was sent.
    assert Step.objects.filter(run=approved, name="send_email", status="done").exists()
    assert not Step.objects.filter(run=rejected, name="send_email").exists()


@pytest.mark.django_db(transaction=True)
def test_cancel_a_running_run(live_server, processes, chromium, tmp_path):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Support", role="operator")
    hold = tmp_path / "hold"
    hold.touch()
    start_worker(processes, hold_file=hold)
    run = submit_run(tenant=member.tenant, kind="support_reply", input=REPLY, cost_ceiling_cents=5)
    wait_until(
        lambda: fresh(run).current_step == "lookup_order", what="the run to reach lookup_order"
    )

    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username)
        page.goto(f"{live_server.url}/runs/{run.id}/")
        expect(page.get_by_test_id("status")).to_have_text("Running")
        expect(page.get_by_test_id("current-step")).to_have_text("lookup_order")
        expect(page.get_by_test_id("steps-done")).to_have_text("1 of 5")
        expect(page.get_by_test_id("step").nth(1).locator(".badge")).to_have_text("Running")
        page.get_by_test_id("step").first.get_by_text("Output").click()  # an open <details> ...
        assert_accessible(page)
        screenshots(page, "run-running")
        for _ in range(2):  # two polls of the run page (htmx's), answered
            with page.expect_response(
                lambda r: (
                    f"/runs/{run.id}/" in r.url and r.request.headers.get("hx-request") == "true"
                )
            ):
                pass
        # ... stays open across polls: the timeline is only re-rendered when it changed.
        expect(page.get_by_test_id("step").first.locator("details").nth(1)).to_have_attribute(
            "open", ""
        )

        page.get_by_role("button", name="Cancel run").click()
        page.locator("#confirm-dialog").get_by_role(
            "button", name="Cancel run"
        ).click()  # it asks first
        expect(page.get_by_role("status")).to_have_text(
            "Cancel requested: the run stops at the end of its current step."
        )
        expect(page.get_by_test_id("status")).to_have_text("Cancelled", timeout=30_000)
        expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)
        expect(page.get_by_role("button", name="Retry")).to_be_visible()
        expect(page.get_by_test_id("advice")).to_contain_text(
            f"{member.user.username} cancelled it."
        )

    run = fresh(run)
    assert run.status == "cancelled"
    assert not Step.objects.filter(run=run, name="draft_reply").exists()


@pytest.mark.django_db(transaction=True)
def test_a_viewer_sees_no_approve_button_and_a_forged_post_is_refused(
    live_server, processes, chromium
):
    from playwright.sync_api import expect

    viewer = MembershipFactory(role="viewer")
    worker = start_worker(processes)
    run = submit_run(tenant=viewer.tenant, kind="support_reply", input=REPLY)
    wait_status(run, "waiting_human", worker, processes)
    before = fresh(run).last_event_seq

    with browser_page(chromium) as page:
        log_in(page, live_server.url, viewer.user.username)
        expect(page.get_by_role("link", name="New run")).to_have_count(0)
        page.goto(f"{live_server.url}/runs/{run.id}/")
        expect(page.get_by_test_id("status")).to_have_text("Needs a person")
        expect(page.get_by_test_id("proposal")).to_contain_text("ana@example.com")
        expect(page.get_by_test_id("no-decision")).to_be_visible()
        expect(page.get_by_role("button", name="Approve")).to_have_count(0)
        expect(page.get_by_role("button", name="Reject")).to_have_count(0)
        expect(page.get_by_role("button", name="Cancel run")).to_have_count(0)

        # A hand-made POST with a valid CSRF token: the server checks the role.
        forged = page.evaluate(
            """async (url) => {
                const token = document.cookie.split('; ').find(c => c.startsWith('csrftoken=')).split('=')[1];
                const response = await fetch(url, {
                    method: 'POST', headers: {'X-CSRFToken': token},
                    body: new URLSearchParams({comment: 'forged', step: '4'}),
                });
                return {status: response.status, text: await response.text()};
            }""",
            f"/runs/{run.id}/approve/",
        )
        assert forged["status"] == 403
        assert "does not allow you to approve runs" in forged["text"]

    run = fresh(run)
    assert run.status == "waiting_human"
    assert run.last_event_seq == before
    assert Step.objects.get(run=run, kind="approval").status == "waiting"


@pytest.mark.django_db(transaction=True)
def test_a_proposal_containing_a_script_tag_is_shown_as_text(live_server, processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(role="approver")
    worker = start_worker(processes)
    run = submit_run(tenant=member.tenant, kind="support_reply", input={**REPLY, "message": XSS})
    wait_status(run, "waiting_human", worker, processes)

    dialogs: list[str] = []
    with browser_page(chromium) as page:
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        log_in(page, live_server.url, member.user.username)
        page.goto(f"{live_server.url}/runs/{run.id}/")
        proposal = page.get_by_test_id("proposal")
        expect(proposal).to_contain_text(
            "You wrote: \u201c<script>window.__xss = 1</script><img src=x onerror="
        )
        expect(proposal.locator("script, img")).to_have_count(0)
        # A poll or two, in case a swap would run it: nothing must happen, so nothing to wait for.
        page.wait_for_timeout(2_500)
        assert page.evaluate("typeof window.__xss") == "undefined"
        # The timeline's step input, shown on request, is text too.
        page.get_by_test_id("step").first.get_by_text("Input").click()
        expect(page.get_by_test_id("step").first).to_contain_text(
            "<script>window.__xss = 1</script>"
        )
        assert page.evaluate("typeof window.__xss") == "undefined"
    assert dialogs == []
    assert fresh(run).status == "waiting_human"


@pytest.mark.django_db(transaction=True)
def test_the_run_list_refreshes_live_rows_and_leads_to_a_failed_run(
    live_server, processes, chromium, tmp_path
):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Support", role="approver")
    hold = tmp_path / "hold"
    worker = start_worker(processes, hold_file=hold)
    # A list with runs in every state people meet, oldest first.
    done = submit_run(tenant=member.tenant, kind="echo", input={"text": "hello"})
    wait_status(done, "done", worker, processes)
    failed = submit_run(
        tenant=member.tenant, kind="support_reply", input={**REPLY, "order": "X-404"}
    )
    wait_status(failed, "failed", worker, processes)
    cancelled = submit_run(tenant=member.tenant, kind="steps", input={"steps": 3}, queue="short")
    cancel_run(run=cancelled, actor=SYSTEM)
    paused = submit_run(tenant=member.tenant, kind="steps", input={"steps": 3}, queue="short")
    pause_run(run=paused, actor=SYSTEM)
    waiting = submit_run(
        tenant=member.tenant, kind="support_reply", input={**REPLY, "order": "A-1003"}
    )
    wait_status(waiting, "waiting_human", worker, processes)
    submit_run(
        tenant=member.tenant, kind="steps", input={"steps": 3}, queue="short"
    )  # no worker on "short"
    hold.touch()
    running = submit_run(
        tenant=member.tenant, kind="support_reply", input={**REPLY, "order": "A-1004"}
    )
    wait_until(
        lambda: fresh(running).current_step == "lookup_order",
        what="the run to reach lookup_order",
    )

    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username)
        rows = page.locator("table.runs-table tbody tr")
        expect(rows).to_have_count(7)
        expect(rows.locator("td[data-label=Status] .badge")).to_have_text(
            ["Running", "Queued", "Needs a person", "Paused", "Cancelled", "Failed", "Done"]
        )
        expect(page.get_by_test_id("waiting-count")).to_have_text("1 run waits for your approval →")
        assert_accessible(page)
        screenshots(page, "run-list")

        # The running row moves on without a reload when its step is released.
        page.evaluate("window.__notReloaded = true")
        hold.unlink()
        running_row = page.locator(f"#run-{running.id}")
        expect(running_row.locator(".badge")).to_have_text("Needs a person", timeout=30_000)
        expect(page.get_by_test_id("waiting-count")).to_have_text("2 runs wait for your approval →")
        assert page.evaluate("window.__notReloaded === true")

        # Filters work without JavaScript: a plain GET form.
        page.get_by_label("Status").select_option("failed")
        page.get_by_role("button", name="Filter").click()
        expect(page).to_have_url(live_server.url + "/?status=failed&kind=&q=")
        expect(rows).to_have_count(1)
        rows.first.get_by_role("link").click()

        expect(page.get_by_test_id("status")).to_have_text("Failed")
        expect(page.get_by_test_id("error")).to_contain_text(
            "order X-404 does not exist in the shop"
        )
        expect(page.get_by_test_id("advice")).to_contain_text(
            "Retrying the same input will fail the same way."
        )
        expect(page.get_by_test_id("step").nth(1).locator(".badge")).to_have_text("Failed")
        expect(page.get_by_role("button", name="Retry")).to_be_visible()
        assert_accessible(page)
        screenshots(page, "run-failed")

    with browser_page(chromium, width=390, height=844) as phone:
        log_in(phone, live_server.url, member.user.username)
        expect(phone.locator("table.runs-table tbody tr")).to_have_count(7)
        # Nothing sticks out sideways at a phone's width.
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        screenshot(phone, "run-list-phone.png")
        phone.goto(f"{live_server.url}/runs/{failed.id}/")
        expect(phone.get_by_test_id("status")).to_have_text("Failed")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
