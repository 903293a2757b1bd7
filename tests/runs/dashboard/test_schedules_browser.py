"""The Schedules page in a real browser: what fires when, what it made and missed, pause and resume.

Django's live server and Debian's Chromium through Playwright (tests/support/browser.py); the
test writes to the database before opening the browser and reads it after. It saves
docs/screenshots/schedules*.png.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import schedules
from runs.models import Run, Schedule
from tests.support.browser import assert_accessible, browser_page, log_in, screenshots
from tests.support.factories import MembershipFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_schedules_page_shows_fires_and_misses_and_pauses_one(live_server, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Support", role="operator")
    digest = Schedule(
        tenant=member.tenant,
        name="Morning digest",
        kind="noop3",
        cron="0 9 * * 1-5",
        timezone="Europe/Paris",
        overlap="skip",
        catch_up="one",
    )
    schedules.arm(digest)
    digest.save()
    sync = Schedule(
        tenant=member.tenant,
        name="CRM sync",
        kind="noop3",
        every_seconds=600,
        overlap="skip",
        catch_up="none",
    )
    sync.created_at = timezone.now() - timedelta(minutes=65)
    sync.next_fire_at = sync.created_at + timedelta(minutes=10)
    sync.save()
    schedules.fire_due()  # six fire times missed while down, none on time: catch_up none
    Schedule.objects.filter(pk=sync.pk).update(next_fire_at=timezone.now())
    schedules.fire_due()  # this one is on time
    made = Run.objects.get(schedule=sync)

    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username, landing="/schedules/")
        rows = page.get_by_test_id("schedule-row")
        expect(rows).to_have_count(2)
        crm = page.locator(f"#schedule-{sync.pk}")
        expect(crm).to_contain_text("every 600 s")
        expect(crm.locator("td[data-label='Runs']")).to_have_text("1")
        expect(crm.locator("td[data-label='Missed']")).to_contain_text("6")
        expect(page.locator(f"#schedule-{digest.pk}")).to_contain_text("0 9 * * 1-5")
        assert_accessible(page)
        screenshots(page, "schedules")

        crm.get_by_role("button", name="Pause").click()
        expect(page.get_by_role("status")).to_contain_text("paused")
        expect(page.locator(f"#schedule-{sync.pk}")).to_contain_text("paused")

        page.locator(f"#schedule-{sync.pk}").get_by_role("link").click()
        expect(page.locator("table.runs-table tbody tr")).to_have_count(1)
        expect(page.locator(f'a[href="/runs/{made.id}/"]')).to_have_count(1)

    sync.refresh_from_db()
    assert (sync.enabled, sync.next_fire_at) == (False, None)
