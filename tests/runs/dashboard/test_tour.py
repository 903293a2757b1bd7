"""A morning of runs, seen by the person supervising them: every dashboard page in a real browser.

The runs are the built-in kinds (research, research_brief, crm_update: some
approved, one rejected, one pointed at a lead that does not exist, one
cancelled while it waited, one over its budget), executed by an in-process
burst worker on the scripted model. Each page is checked with axe-core (no
serious or critical violations), for sideways scroll at 390 px, and saved
at 1280 and 390 px under docs/screenshots/ (tests/support/browser.py).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from examples.crm.models import Lead
from runs.control import approve_run, cancel_run, reject_run
from runs.keys import create_api_key
from runs.models import Run
from runs.services import Actor, submit_run
from tests.support.browser import assert_accessible, browser, log_in, screenshots
from tests.support.factories import MembershipFactory
from tests.support.fake_openai import drive

pytest_plugins = ["tests.support.fake_openai"]  # the offline fixture
pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "How does a worker avoid running a step twice after a crash?"


def morning(tenant, person: Actor, bot: Actor) -> dict[str, Run]:
    """The runs of the morning, each in the state the issue describes."""
    kim = Lead.objects.create(
        tenant=tenant, name="Kim Lee", company="Acme", email="kim@acme.test", stage="proposal"
    )
    ana = Lead.objects.create(
        tenant=tenant, name="Ana Lopez", company="Globex", email="ana@globex.test", stage="new"
    )
    runs = {
        "research": submit_run(
            tenant=tenant,
            kind="research",
            input={"question": QUESTION, "max_sources": 2},
            actor=bot,
        ),
        "brief": submit_run(
            tenant=tenant,
            kind="research_brief",
            input={"topic": "Durable execution engines"},
            actor=person,
        ),
        "approved": submit_run(
            tenant=tenant,
            kind="crm_update",
            actor=person,
            input={"lead_id": kim.pk, "instruction": "They signed the contract today"},
        ),
        "rejected": submit_run(
            tenant=tenant,
            kind="crm_update",
            actor=person,
            input={"lead_id": ana.pk, "instruction": "They signed the contract today"},
        ),
        "missing": submit_run(
            tenant=tenant,
            kind="crm_update",
            actor=bot,
            input={"lead_id": 999_999, "instruction": "We had a call, they are qualified"},
        ),
        "waiting": submit_run(
            tenant=tenant,
            kind="crm_update",
            actor=person,
            input={"lead_id": ana.pk, "instruction": "Sent them our proposal and a quote"},
        ),
        "cancelled": submit_run(
            tenant=tenant,
            kind="crm_update",
            actor=person,
            input={"lead_id": kim.pk, "instruction": "We had a call, they are qualified"},
        ),
        "over_budget": submit_run(
            tenant=tenant,
            kind="research",
            actor=bot,
            input={"question": "What is a lease and who renews it?", "max_sources": 2},
            cost_ceiling_cents=Decimal("0.0001"),
        ),
    }
    drive(*runs.values())
    approve_run(run=runs["approved"], actor=person, comment="Confirmed on the phone")
    reject_run(
        run=runs["rejected"], actor=person, comment="Not signed yet: the legal review is pending"
    )
    cancel_run(run=runs["cancelled"], actor=bot)
    drive(runs["approved"], runs["rejected"])
    return {name: Run.objects.get(pk=run.pk) for name, run in runs.items()}


def test_a_morning_of_runs_reads_as_what_happened(live_server, chromium, offline):
    from playwright.sync_api import expect

    member = MembershipFactory(
        role="approver", tenant__name="Acme Sales", user__first_name="Ana", user__last_name="Lopez"
    )
    key = create_api_key(tenant=member.tenant, name="ci-bot").api_key
    person = Actor(type="user", id=str(member.user.pk))
    bot = Actor(type="api_key", id=str(key.pk))
    runs = morning(member.tenant, person, bot)
    assert runs["rejected"].status == "done" and runs["rejected"].outcome == "unchanged"
    assert runs["missing"].status == "done" and runs["missing"].outcome == "unchanged"
    assert runs["approved"].outcome == "succeeded"
    assert runs["waiting"].status == "waiting_human"
    assert runs["over_budget"].status == "failed" and runs["over_budget"].error_kind == "budget"

    with browser(chromium) as instance:
        page = instance.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(15_000)
        log_in(page, live_server.url, member.user.username)

        # The list: titles from the input, and what each run did before anything else.
        table = page.locator("table.runs-table")
        rejected_row = page.locator(f"#run-{runs['rejected'].id}")
        expect(rejected_row.locator(".badge")).to_have_text("Nothing changed")
        expect(rejected_row.get_by_test_id("row-summary")).to_contain_text("reject")
        expect(page.locator(f"#run-{runs['missing'].id} .badge")).to_have_text("Nothing changed")
        expect(page.locator(f"#run-{runs['approved'].id} .badge")).to_have_text("Done")
        expect(page.locator(f"#run-{runs['research'].id} .run-title")).to_have_text(QUESTION)
        expect(page.locator(f"#run-{runs['research'].id} .progress-cell")).to_contain_text(
            f"{runs['research'].steps_done} steps"
        )  # no total announced: never a bare number
        expect(table).not_to_contain_text("Attempt")
        assert_accessible(page)
        screenshots(page, "tour-run-list")

        # Search matches words of the titles and inputs.
        page.get_by_role("searchbox", name="Search").fill("contract")
        page.get_by_role("button", name="Filter").click()
        expect(page.locator("table.runs-table tbody tr")).to_have_count(2)
        expect(table).to_contain_text("They signed the contract today")
        screenshots(page, "tour-run-list-search")

        # The rejected write: it says nothing changed, the approval step says Rejected and who did it.
        page.goto(f"{live_server.url}/runs/{runs['rejected'].id}/")
        expect(page.get_by_test_id("title")).to_contain_text("They signed the contract today")
        expect(page.get_by_test_id("status")).to_have_text("Nothing changed")
        expect(page.get_by_test_id("summary")).to_be_visible()
        approval = page.get_by_test_id("step").filter(has_text="Approve update_lead")
        expect(approval.locator(".badge")).to_have_text("Rejected")
        expect(page.get_by_test_id("input")).to_contain_text("They signed the contract today")
        expect(page.get_by_test_id("attempt")).to_have_count(0)
        # The counter agrees with the timeline: a decided approval is a finished step too.
        listed = page.get_by_test_id("step").count()
        expect(page.get_by_test_id("steps-done")).to_have_text(f"{listed} steps")
        # Who did what, by name, with their words.
        activity = page.get_by_test_id("activity")
        expect(activity).to_contain_text("Ana Lopez submitted it")
        expect(
            activity.get_by_test_id("activity-entry").filter(has_text="rejected")
        ).to_contain_text("Ana Lopez")
        expect(activity).to_contain_text("Not signed yet: the legal review is pending")
        expect(page.get_by_test_id("submitted-by")).to_have_text("Ana Lopez")
        # Each model call is a transcript: what it was sent and what it answered.
        model_call = page.get_by_test_id("step").filter(has=page.get_by_test_id("transcript")).first
        expect(model_call.get_by_test_id("transcript-assistant").first).to_be_visible()
        assert_accessible(page)
        screenshots(page, "tour-run-rejected")

        # The cancelled run's pending approval is not "Waiting" any more.
        page.goto(f"{live_server.url}/runs/{runs['cancelled'].id}/")
        expect(page.get_by_test_id("status")).to_have_text("Cancelled")
        pending = page.get_by_test_id("step").filter(has_text="Approve update_lead")
        expect(pending.locator(".badge")).to_have_text("Never decided")
        expect(page.get_by_test_id("advice")).to_contain_text("API key ‘ci-bot’ cancelled it.")
        expect(page.get_by_test_id("activity")).to_contain_text("API key ‘ci-bot’")
        assert_accessible(page)
        screenshots(page, "tour-run-cancelled")

        # Money under a cent keeps its digits.
        page.goto(f"{live_server.url}/runs/{runs['over_budget'].id}/")
        expect(page.get_by_test_id("cost")).not_to_contain_text("<")
        expect(page.get_by_test_id("status")).to_have_text("Failed")
        ceiling = page.get_by_label("New cost ceiling (¢)")
        assert Decimal(ceiling.input_value()) > runs["over_budget"].cost_cents
        expect(page.get_by_test_id("retry")).to_contain_text(
            "the new ceiling counts the cost so far"
        )
        assert_accessible(page)
        screenshots(page, "tour-run-over-budget")

        # The research answer is Markdown, its citations link to the steps that read the sources.
        page.goto(f"{live_server.url}/runs/{runs['research'].id}/")
        answer = page.get_by_test_id("answer-text")
        expect(answer).to_be_visible()
        expect(answer).not_to_contain_text("\\n")
        citation = answer.locator("a.citation").first
        target = citation.get_attribute("href")
        assert target.startswith("#step-") or target.startswith("#source-"), target
        expect(page.locator(target)).to_have_count(1)
        expect(page.get_by_test_id("sources")).to_be_visible()
        expect(page.get_by_test_id("result")).to_be_hidden()  # the raw JSON is one click away
        page.get_by_text("Result as JSON").click()
        expect(page.get_by_test_id("result")).to_contain_text('"citations"')

        for name in ("research", "brief", "approved", "missing"):
            page.goto(f"{live_server.url}/runs/{runs[name].id}/")
            expect(page.get_by_test_id("status")).to_be_visible()
            assert_accessible(page)
            screenshots(page, f"tour-run-{name}")

        # The pending approval: Reject asks first; going back changes nothing.
        page.goto(f"{live_server.url}/runs/{runs['waiting'].id}/")
        expect(page.get_by_test_id("approval")).to_be_visible()
        # The proposal says what changes, on what, from what to what.
        proposal = page.get_by_test_id("proposal")
        expect(proposal.get_by_test_id("proposal-summary")).to_contain_text("Ana Lopez")
        stage = proposal.get_by_test_id("change").filter(has_text="Stage")
        expect(stage.locator("td.before")).to_have_text("new")
        expect(stage.locator("td.after")).to_have_text("proposal")
        assert_accessible(page)
        screenshots(page, "tour-run-waiting")
        page.get_by_role("button", name="Reject").click()
        dialog = page.locator("#confirm-dialog")
        expect(dialog).to_be_visible()
        expect(dialog).to_contain_text("Reject this proposal?")
        assert_accessible(page)
        screenshots(page, "tour-confirm-reject", check=False)
        dialog.get_by_role("button", name="Go back").click()
        expect(dialog).to_be_hidden()
        expect(page.get_by_test_id("approval")).to_be_visible()

        # Cancel asks too, and cancels once confirmed.
        page.get_by_role("button", name="Cancel run").click()
        expect(dialog).to_contain_text("Cancel this run?")
        dialog.get_by_role("button", name="Cancel run").click()
        expect(page.locator(".flash")).to_contain_text("Run cancelled")
        expect(page.get_by_test_id("status")).to_have_text("Cancelled")

        # The submit pages.
        page.goto(f"{live_server.url}/runs/new/")
        assert_accessible(page)
        screenshots(page, "tour-submit")
        page.goto(f"{live_server.url}/runs/new/?kind=crm_update")
        assert_accessible(page)
        screenshots(page, "tour-submit-crm-update")
        page.close()

        # Without JavaScript the same button lands on a confirmation page instead of acting.
        context = instance.new_context(
            java_script_enabled=False, viewport={"width": 1280, "height": 800}
        )
        plain = context.new_page()
        plain.set_default_timeout(15_000)
        log_in(
            plain, live_server.url, member.user.username, landing=f"/runs/{runs['over_budget'].id}/"
        )
        plain.get_by_role(
            "button", name="Retry"
        ).click()  # not destructive (a larger ceiling is filled in)
        expect(plain.locator(".flash")).to_contain_text("Run queued again")
        plain.get_by_role("button", name="Cancel run").click()
        expect(plain.get_by_test_id("confirm-page")).to_contain_text("Cancel this run?")
        screenshots(plain, "tour-confirm-page")
        plain.get_by_role("link", name="Go back").click()
        expect(plain.get_by_test_id("status")).to_have_text("Queued")
        context.close()
        # (axe runs in the page's JavaScript: it checks the same confirmation page in a page that has it.)
        page = instance.new_page(viewport={"width": 1280, "height": 800})
        log_in(
            page, live_server.url, member.user.username, landing=f"/runs/{runs['over_budget'].id}/"
        )
        page.evaluate(
            "() => document.querySelectorAll('[data-confirm]').forEach(b => b.removeAttribute('data-confirm'))"
        )
        page.get_by_role("button", name="Cancel run").click()
        expect(page.get_by_test_id("confirm-page")).to_be_visible()
        assert_accessible(page)

    assert Run.objects.get(pk=runs["waiting"].pk).status == "cancelled"


MODEL_XSS = (
    '**Bold** and <script>window.__xss = 1</script> and <img src=x onerror="window.__xss = 2">.\n\n'
    '[a link](javascript:window.__xss=3) <a href="#" onclick="window.__xss=4">raw</a>'
)


def test_a_model_answer_holding_html_is_shown_as_text_and_never_runs(live_server, chromium):
    from playwright.sync_api import expect

    from tests.support.run_states import force_status

    member = MembershipFactory(role="viewer")
    run = submit_run(tenant=member.tenant, kind="research", input={"question": "<b>hostile?</b>"})
    force_status(
        run, "done", result={"question": "<b>hostile?</b>", "answer": MODEL_XSS, "citations": []}
    )

    with browser(chromium) as instance:
        page = instance.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(15_000)
        log_in(page, live_server.url, member.user.username, landing=f"/runs/{run.id}/")
        answer = page.get_by_test_id("answer-text")
        expect(answer.locator("strong")).to_have_text("Bold")  # Markdown is rendered...
        expect(answer).to_contain_text("<script>window.__xss = 1</script>")  # ... HTML stays text
        expect(answer).to_contain_text('onerror="window.__xss = 2"')
        assert answer.locator("script, img, [onclick], [onerror]").count() == 0
        link = answer.get_by_text("a link")
        assert (link.get_attribute("href") or "").startswith("javascript") is False
        link.click()
        expect(page.get_by_test_id("title")).to_have_text("<b>hostile?</b>")
        assert page.evaluate("() => window.__xss") is None


def test_a_page_the_role_does_not_allow_says_why_and_leads_back(live_server, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(role="viewer", tenant__name="Acme Sales")
    with browser(chromium) as instance:
        page = instance.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(15_000)
        log_in(page, live_server.url, member.user.username)
        response = page.goto(f"{live_server.url}/runs/new/")
        assert response.status == 403
        expect(page.get_by_test_id("forbidden")).to_contain_text(
            "(viewer) does not allow you to submit runs"
        )
        assert_accessible(page)
        screenshots(page, "tour-forbidden")
        page.get_by_role("link", name="Back to the runs").click()
        expect(page.get_by_role("heading", name="Runs")).to_be_visible()
