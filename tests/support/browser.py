"""Shared helpers of the browser tests: Debian's Chromium through Playwright, screenshots, layout and axe checks.

Playwright cannot download its own browsers here, so the tests drive the
system Chromium. Without it they are skipped, except under CI, where a
missing browser is a failure.

Playwright's sync API keeps an asyncio loop running in its thread, so
Django's ORM refuses to run while the browser is open: a test writes its
data (and waits for the worker in the database) before opening the browser,
and reads the database after closing it.

Screenshots go to docs/screenshots/ (DASHBOARD_SCREENSHOTS=<dir> saves them
elsewhere); ``screenshots`` takes the 1280 px and the 390 px one of a page.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or ROOT / "docs" / "screenshots")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
# What the axe check fails on; "moderate" and "minor" findings are printed, not failed.
AXE_FAILING_IMPACTS = ("serious", "critical")


def find_chromium() -> str | None:
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium")


def require_chromium() -> str:
    """The Chromium executable (the ``chromium`` fixture of tests/conftest.py): skip without it, fail under CI."""
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
def browser(executable: str) -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        instance = pw.chromium.launch(executable_path=executable, headless=True, args=CHROMIUM_ARGS)
        try:
            yield instance
        finally:
            instance.close()


@contextlib.contextmanager
def browser_page(executable: str, *, width: int = 1100, height: int = 760) -> Iterator:
    with browser(executable) as instance:
        page = instance.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(15_000)
        yield page


def log_in(
    page, base_url: str, username: str, *, password: str = "secret-pass", landing: str = "/"
) -> None:
    """Log in through the login form (the factories' users have ``secret-pass``)."""
    from playwright.sync_api import expect

    page.goto(base_url + landing)
    page.wait_for_url("**/accounts/login/**")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(base_url + landing)


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / name), full_page=True)


def horizontal_overflow(page) -> int:
    """How many CSS pixels the page is wider than its viewport (0: no horizontal scroll)."""
    return page.evaluate(
        "() => Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)"
        " - document.documentElement.clientWidth"
    )


def assert_no_horizontal_scroll(page) -> None:
    overflow = horizontal_overflow(page)
    if overflow > 0:
        wide = page.evaluate(
            """() => {
              const limit = document.documentElement.clientWidth;
              return [...document.querySelectorAll('body *')]
                .filter(e => e.getBoundingClientRect().right > limit + 1)
                .slice(0, 8)
                .map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : '') + ' ' + Math.round(e.getBoundingClientRect().right));
            }"""
        )
        raise AssertionError(
            f"{page.url} scrolls sideways by {overflow}px at {page.viewport_size['width']}px: {wide}"
        )


def axe_violations(page, *, impacts: tuple[str, ...] = AXE_FAILING_IMPACTS) -> list[str]:
    """The axe-core violations of the page as it is now, of the given impacts, one readable line each.

    axe runs in the page's JavaScript: a page without JavaScript cannot be checked (it would wait forever).
    """
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    found = []
    for violation in results.response["violations"]:
        if violation.get("impact") not in impacts:
            continue
        targets = [
            " ".join(map(str, node.get("target", []))) for node in violation.get("nodes", [])
        ][:5]
        found.append(f"{violation['impact']}: {violation['id']} ({violation['help']}) at {targets}")
    return found


def assert_accessible(page) -> None:
    found = axe_violations(page)
    assert not found, f"axe found serious or critical problems on {page.url}:\n" + "\n".join(found)


def screenshots(page, name: str, *, check: bool = True) -> None:
    """Save ``<name>.png`` at 1280 px and ``<name>-phone.png`` at 390 px, checking each for sideways scroll.

    The page's viewport is set back to what it was.
    """
    before = page.viewport_size
    for size, suffix in ((DESKTOP, ""), (PHONE, "-phone")):
        page.set_viewport_size(size)
        page.wait_for_timeout(
            100
        )  # let the layout settle for a screenshot (asserts nothing on time)
        if check:
            assert_no_horizontal_scroll(page)
        screenshot(page, f"{name}{suffix}.png")
    if before:
        page.set_viewport_size(before)
