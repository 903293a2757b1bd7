"""The run page of workflows in a real browser: a rolled-back saga, and a fan-out tree of child runs.

Same set-up as tests/support/browser.py (Debian's Chromium through
Playwright, real worker processes); the screenshots are the README's.
"""

from __future__ import annotations

import pytest

from examples.deploys.models import Resource
from runs.models import Run, Step
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.browser import assert_accessible, browser_page, log_in, screenshot, screenshots  # noqa: F401
from tests.support.factories import MembershipFactory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def demo_worker(processes):
    return processes.worker(
        "--heartbeat", "1", "--poll", "0.2", "--concurrency", "6", RUNS_DEMO_DELAY_SCALE="0.05"
    )


def test_a_rolled_back_saga_shows_what_was_undone(live_server, processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Ops", role="approver")
    run = submit_run(
        tenant=member.tenant, kind="deploy_app", input={"app": "shop", "fail_at": "monitoring"}
    )
    worker = demo_worker(processes)
    wait_until(
        lambda: fresh(run).status == "failed" or worker.poll() is not None,
        timeout=60,
        what="the deploy to fail and roll back",
    )
    run = fresh(run)
    assert (run.status, run.compensation) == ("failed", "done"), processes.output(worker)
    # Nothing is left behind in the demo resource table.
    assert sorted(Resource.objects.filter(run_id=run.id).values_list("kind", "state")) == [
        ("certificate", "deleted"),
        ("container", "deleted"),
        ("dns", "deleted"),
    ]
    assert list(Step.objects.filter(run=run).order_by("seq").values_list("status", flat=True)) == [
        "compensated",
        "compensated",
        "compensated",
        "failed",
        "done",
        "done",
        "done",
        "done",
    ]

    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username)
        page.goto(f"{live_server.url}/runs/{run.id}/")
        expect(page.get_by_test_id("status")).to_have_text("Failed")
        expect(page.get_by_test_id("compensation")).to_have_text("rolled back")
        expect(page.get_by_test_id("error")).to_contain_text("quota exceeded")
        expect(page.get_by_test_id("error")).to_contain_text(
            "rolled back: start container (step 3), issue certificate (step 2), create DNS record (step 1)"
        )
        expect(page.get_by_test_id("advice")).to_contain_text("Rolled back")
        expect(page.get_by_test_id("retry")).to_contain_text(
            "the steps its rollback undid run again"
        )
        steps = page.get_by_test_id("step")
        expect(steps.locator(".step-name")).to_have_text(
            [
                "create DNS record",
                "issue certificate",
                "start container",
                "register monitoring",
                "rollback",
                "undo start container",
                "undo issue certificate",
                "undo create DNS record",
            ]
        )
        expect(steps.locator(".badge")).to_have_text(["Undone"] * 3 + ["Failed"] + ["Done"] * 4)
        assert_accessible(page)
        screenshots(page, "run-rolled-back")


def test_a_fan_out_shows_its_tree_of_child_runs(live_server, processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", role="operator", tenant__max_running=6)
    questions = [
        "How does a lease keep two workers apart?",
        "What happens to a run when its worker dies?",
        "How are costs bounded?",
    ]
    parent = submit_run(tenant=member.tenant, kind="research_many", input={"questions": questions})
    worker = demo_worker(processes)
    wait_until(
        lambda: fresh(parent).status in ("done", "failed") or worker.poll() is not None,
        timeout=90,
        what="the lead run to finish",
    )
    parent = fresh(parent)
    assert parent.status == "done", parent.error + processes.output(worker)
    children = list(Run.objects.filter(parent=parent).order_by("created_at"))
    assert [c.status for c in children] == ["done"] * 3
    assert [c.input["question"] for c in children] == questions
    assert parent.result["summary"].startswith("3 of 3 questions answered")

    with browser_page(chromium) as page:
        log_in(page, live_server.url, member.user.username)
        page.goto(f"{live_server.url}/runs/{parent.id}/")
        expect(page.get_by_test_id("status")).to_have_text("Done")
        rows = page.get_by_test_id("child")
        expect(rows).to_have_count(3)
        expect(rows.locator(".child-title")).to_have_text(questions)
        expect(rows.locator(".badge")).to_have_text(["Done"] * 3)
        expect(page.get_by_test_id("children")).to_contain_text("3 done")
        assert_accessible(page)
        screenshots(page, "run-fan-out")
        rows.first.get_by_role("link").click()
        expect(page.get_by_test_id("lineage")).to_contain_text(f"Child run of {questions[0]}")
        page.get_by_test_id("lineage").get_by_role("link").click()
        expect(page.get_by_test_id("children")).to_be_visible()

    with browser_page(chromium, width=390, height=844) as phone:
        log_in(phone, live_server.url, member.user.username)
        phone.goto(f"{live_server.url}/runs/{parent.id}/")
        expect(phone.get_by_test_id("child")).to_have_count(3)
        # The table of children folds into rows at a phone's width: nothing sticks out sideways.
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
