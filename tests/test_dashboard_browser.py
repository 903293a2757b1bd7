"""The dashboard in a real browser: a run page follows a run executed by a real worker process.

Drives Debian's Chromium through Playwright (Playwright cannot download its
own browsers here). Without Chromium the test is skipped, except under CI,
where a missing browser is a failure.

Playwright's sync API keeps an asyncio loop running in this thread, so
Django's ORM refuses to run while the browser is open: the test writes its
data before opening the browser and reads the database after closing it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator

import pytest

from runs.services import submit_run
from tests.conftest import fresh
from tests.factories import MembershipFactory

SCREENSHOT = "/tmp/dashboard-run.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


def find_chromium() -> str | None:
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium")


@pytest.fixture
def chromium() -> str:
    path = find_chromium()
    try:
        import playwright  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the playwright package is not installed: pip install -e '.[test]'")
        pytest.skip("the playwright package is not installed: pip install -e '.[test]'")
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(
                "Chromium not found at /usr/bin/chromium or on PATH (apt-get install chromium)"
            )
        pytest.skip(
            "Chromium not found at /usr/bin/chromium or on PATH (apt-get install chromium); CI is not set"
        )
    return path


@contextlib.contextmanager
def browser_page(executable: str) -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


@pytest.mark.django_db(transaction=True)
def test_run_page_follows_a_worker_to_done_without_reloading(live_server, processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research")
    run = submit_run(tenant=member.tenant, kind="steps", input={"steps": 4, "step_seconds": 1.0})
    run_path = f"/runs/{run.id}/"

    requests: list[tuple[float, str]] = []
    navigations: list[str] = []
    worker = None
    with browser_page(chromium) as page:
        page.on("request", lambda request: requests.append((time.monotonic(), request.url)))
        page.on(
            "framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
        )

        # Logging in through the form lands on the run list.
        page.goto(live_server.url + "/")
        expect(page).to_have_url(f"{live_server.url}/accounts/login/?next=/")
        page.get_by_label("Username").fill(member.user.username)
        page.get_by_label("Password").fill("secret-pass")
        page.get_by_role("button", name="Log in").click()
        expect(page).to_have_url(live_server.url + "/")
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
        expect(page.get_by_text("Acme Research")).to_be_visible()

        # The run's link opens its page: queued, nothing done yet.
        page.locator(f'a[href="{run_path}"]').click()
        expect(page).to_have_url(live_server.url + run_path)
        status = page.get_by_test_id("status")
        steps_done = page.get_by_test_id("steps-done")
        expect(status).to_have_text("Queued")
        expect(steps_done).to_have_text("0")
        # A marker that a reload would wipe out.
        page.evaluate("window.__notReloaded = true")
        navigations.clear()

        worker = processes.worker("--burst")

        # Polling shows the run while it runs (4 steps of 1 s, polled every 2 s) ...
        expect(status).to_have_text("Running", timeout=30_000)
        expect(page.get_by_test_id("current-step")).to_contain_text("step")
        # ... and then done, with every step counted.
        expect(status).to_have_text("Done", timeout=30_000)
        done_at = time.monotonic()
        expect(steps_done).to_have_text("4 of 4")
        expect(page.locator("progress")).to_have_attribute("value", "4")
        expect(page.get_by_test_id("result")).to_contain_text('"steps": 4')
        expect(page.get_by_test_id("steps").get_by_role("listitem")).to_have_text(
            [f"step{n} Done" for n in range(1, 5)]
        )

        assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"
        assert navigations == []

        # The 286 answer stopped polling: no request to the run page afterwards.
        page.wait_for_timeout(5_000)
        polls_after_done = [url for at, url in requests if at > done_at and url.endswith(run_path)]
        assert polls_after_done == []
        polls_before_done = [
            url for at, url in requests if at <= done_at and url.endswith(run_path)
        ]
        assert len(polls_before_done) >= 3  # the page itself, then at least two polls

        page.screenshot(path=SCREENSHOT, full_page=True)

    assert worker.wait(30) == 0, processes.output(worker)
    run = fresh(run)
    assert run.status == "done"
    assert run.steps_done == 4
