"""A thread's page in a real browser: a conversation played by a real worker, followed live on the
thread's event stream, with the composer, an approval inside a turn, a refusal and the close.

The production web server (``manage.py serve``, ASGI: Django's ``live_server``
is WSGI, where an event stream is only sent once it has ended) and a worker
run as real processes; Debian's Chromium is driven through Playwright (see
tests/support/browser.py, whose helpers these share). The tests write to the
database before opening the browser and read it after closing it:
Playwright's loop in this thread keeps the ORM out meanwhile. They save
docs/screenshots/thread*.png.
"""

from __future__ import annotations

import re

import pytest

from runs.events import SYSTEM, Actor
from runs.models import Message, Run, Step, Thread
from runs.threads import close_thread, create_thread
from tests.support.browser import assert_accessible, browser_page, log_in, screenshots
from tests.support.factories import MembershipFactory
from tests.support.waiting import wait_until
from tests.support.web import Web

pytestmark = pytest.mark.django_db(transaction=True)


class Watched:
    """What a page says went wrong: script errors, and what the Content-Security-Policy refused."""

    def __init__(self, page):
        self.problems: list[str] = []
        page.on("pageerror", lambda error: self.problems.append(f"script error: {error}"))
        page.on("console", self._console)

    def _console(self, message) -> None:
        if message.type == "error" or "Content Security Policy" in message.text:
            # The stream's reconnects and the refusals the test asks for are answered requests, not faults.
            if "the server responded with a status of 409" not in message.text:
                self.problems.append(f"console: {message.text}")


def settled(thread: Thread, worker, processes, status: str = "asleep") -> Thread:
    def reached():
        assert worker.poll() is None, processes.output(worker)
        found = Thread.objects.get(pk=thread.pk)
        return found.status == status and found

    return wait_until(reached, timeout=30, what=f"thread {thread.pk} to be {status}")


def test_a_reply_appears_live_and_an_approval_is_decided_inside_its_turn(processes, chromium):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Support", role="approver")
    member.user.first_name, member.user.last_name = "Dana", "Okafor"
    member.user.save()
    web = Web(processes).start()
    worker = processes.worker("--poll", "0.2", "--heartbeat", "1")
    thread, _, _ = create_thread(
        tenant=member.tenant,
        kind="support_assistant",
        actor=Actor(type="user", id=str(member.user.pk)),
        title="Duplicate charge on my invoice",
        policy="enqueue",
        cost_ceiling_cents=500,
        message="How do retries and backoff work when a model call fails?",
    )
    settled(thread, worker, processes)  # turn 1 answered before the page opens
    # Two more for the list: one closed by a person, one that never woke.
    earlier, _, _ = create_thread(
        tenant=member.tenant, kind="support_assistant", actor=SYSTEM, title="Webhook retries"
    )
    close_thread(thread=earlier, actor=SYSTEM, summary="Answered by email.")
    create_thread(tenant=member.tenant, kind="thread_echo", actor=SYSTEM, policy="reject")
    url = f"{web.base}/threads/{thread.pk}/"

    navigations: list[str] = []
    with browser_page(chromium, width=1280, height=900) as page:
        watched = Watched(page)
        log_in(page, web.base, member.user.username, landing=f"/threads/{thread.pk}/")
        expect(page.get_by_test_id("title")).to_have_text("Duplicate charge on my invoice")
        expect(page.get_by_test_id("thread-status")).to_have_text("Asleep")
        expect(page.locator("#turn-1 [data-role=agent]")).to_contain_text("[retries-and-backoff]")
        # The page follows the thread's event stream.
        expect(page.get_by_text("Live: replies appear as the agent writes them.")).to_be_visible()

        # The composer says what a message will do, and follows the mention box.
        hint = page.get_by_test_id("composer-hint")
        expect(hint).to_have_text("Your message starts turn 2.")
        mention = page.get_by_label("Mention the agent")
        mention.uncheck()
        expect(hint).to_have_text("Your message is recorded for the next turn; nothing wakes.")
        mention.check()
        expect(hint).to_have_text("Your message starts turn 2.")

        # Send: the reply appears without the page being loaded again.
        page.evaluate("window.__notReloaded = true")
        page.on(
            "framenavigated",
            lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
        )
        composer = page.get_by_role("textbox", name="Message")
        composer.fill("Can I pause a run and resume it later?")
        page.get_by_role("button", name="Send").click()
        expect(page.get_by_test_id("composer-sent")).to_have_text("Message sent: it starts turn 2.")
        expect(composer).to_have_value("")
        expect(composer).to_be_focused()
        expect(page.locator("#turn-2 [data-role=person]")).to_contain_text(
            "Can I pause a run and resume it later?"
        )
        expect(page.locator("#turn-2 [data-role=person]")).to_contain_text("Dana Okafor")
        expect(page.locator("#turn-2 [data-role=agent]")).to_be_visible(timeout=30_000)
        expect(page.locator("#turn-2 [data-testid=turn-status]")).to_have_text("Done")
        expect(page.get_by_test_id("thread-status")).to_have_text("Asleep")
        expect(page.get_by_test_id("turns")).to_have_text("2")
        assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"
        assert navigations == []

        # A turn's steps open in place and stay open across the live refreshes.
        steps = page.locator("#turn-2-steps")
        steps.locator("summary").click()
        expect(steps.get_by_test_id("turn-step").first).to_be_visible()

        # A credit: the turn waits for a person, and the approval shows inside it, live.
        composer.fill("I was charged twice, please refund 1200")
        page.get_by_role("button", name="Send").click()
        card = page.locator("#turn-3").get_by_test_id("approval")
        expect(card).to_be_visible(timeout=30_000)
        expect(card.get_by_role("heading")).to_have_text("Approval needed: Approve issue_credit")
        expect(card.get_by_test_id("proposal")).to_contain_text("1200")
        expect(page.locator("#turn-3 [data-testid=turn-status]")).to_have_text("Needs a person")
        expect(steps).to_have_attribute("open", "")  # opened by the person, kept open
        assert page.evaluate("window.__notReloaded === true")
        assert_accessible(page)
        screenshots(page, "thread-approval")

        # Approving goes through the run's action and lands back on the thread, at the turn.
        card.get_by_label("Comment").fill("Confirmed the duplicate charge.")
        card.get_by_role("button", name="Approve").click()
        expect(page).to_have_url(re.compile(re.escape(url) + "#turn-3$"))
        expect(page.get_by_role("status").first).to_have_text("Approved: the run continues.")
        expect(page.locator("#turn-3 [data-role=agent]")).to_contain_text(
            "Done: a credit of 1200 cents", timeout=30_000
        )
        expect(page.get_by_test_id("thread-state")).to_contain_text("Credits cents")
        expect(page.get_by_test_id("thread-state")).to_contain_text("credit issued")
        expect(page.get_by_test_id("composer-hint")).to_have_text("Your message starts turn 4.")
        assert_accessible(page)  # with the flash shown
        # The page as it opens next time.
        page.goto(url)
        expect(page.locator("#turn-3 [data-role=agent]")).to_contain_text("Done: a credit")
        assert_accessible(page)
        screenshots(page, "thread")

        # The list: newest first, each with its status, policy, turns, last activity and cost.
        page.get_by_role("navigation").get_by_role("link", name="Threads").click()
        rows = page.get_by_test_id("thread-row")
        expect(rows).to_have_count(3)
        expect(rows.locator(".run-title")).to_have_text(
            ["thread_echo", "Webhook retries", "Duplicate charge on my invoice"]
        )
        expect(rows.nth(1)).to_contain_text("Answered by email.")
        expect(rows.nth(2)).to_contain_text("Asleep")
        assert_accessible(page)
        screenshots(page, "thread-list")

        page.get_by_role("link", name="New thread").first.click()
        expect(page.get_by_label("Agent")).to_be_visible()
        assert_accessible(page)
        screenshots(page, "thread-new")
        assert watched.problems == []

    thread = Thread.objects.get(pk=thread.pk)
    assert (thread.status, thread.turns) == ("asleep", 3)
    assert thread.state["credits_cents"] == 1200
    approval = Step.objects.get(run__thread=thread, run__turn=3, kind="approval")
    assert approval.output["approved"] is True
    people = Message.objects.filter(thread=thread).exclude(author_type="agent")
    assert {m.author_id for m in people} == {str(member.user.pk)}
    assert worker.poll() is None, processes.output(worker)


def test_a_refusal_shows_in_the_composer_then_the_thread_wakes_and_closes(
    processes, chromium, tmp_path
):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Support", role="operator")
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "1").touch()  # turn 1 holds mid-step until the test lets it go
    web = Web(processes).start()
    worker = processes.worker("--poll", "0.2", "--heartbeat", "1")
    thread, _, _ = create_thread(
        tenant=member.tenant,
        kind="thread_echo",
        actor=Actor(type="user", id=str(member.user.pk)),
        title="Echo, one at a time",
        policy="reject",
        state={"gate": str(gate)},
        message="first",
    )
    wait_until(
        lambda: Run.objects.filter(thread=thread, turn=1, status="running").exists(),
        what="turn 1 to run",
    )

    with browser_page(chromium, width=390, height=844) as page:
        watched = Watched(page)
        log_in(page, web.base, member.user.username, landing=f"/threads/{thread.pk}/")
        expect(page.get_by_test_id("thread-status")).to_have_text("Active")
        expect(page.get_by_test_id("working")).to_contain_text("thread_echo is working")
        hint = page.get_by_test_id("composer-hint")
        expect(hint).to_have_text("Your message is refused while turn 1 is live.")

        # Refused: the reason shows in the composer (a 409 through htmx), and what was typed stays.
        composer = page.get_by_role("textbox", name="Message")
        composer.fill("are you there?")
        page.get_by_role("button", name="Send").click()
        refusal = page.get_by_test_id("composer-refusal")
        expect(refusal).to_contain_text("Not sent: turn 1 is live")
        expect(composer).to_have_value("are you there?")
        assert_accessible(page)
        screenshots(page, "thread-refused")
        # A fresh page: axe leaves empty style attributes behind, which htmx's swaps would then copy
        # (and the Content-Security-Policy refuse).
        page.reload()

        # The turn goes on: its reply appears, and the sentence follows the thread falling asleep.
        (gate / "1").unlink()
        expect(page.locator("#turn-1 [data-role=agent]")).to_have_text(
            re.compile("echo: first"), timeout=30_000
        )
        expect(hint).to_have_text("Your message starts turn 2.")
        composer.fill("are you there?")
        page.get_by_role("button", name="Send").click()
        expect(page.locator("#turn-2 [data-role=agent]")).to_contain_text(
            "echo: are you there?", timeout=30_000
        )

        # Closing asks first, then the composer is closed.
        page.get_by_role("button", name="Close thread").click()
        dialog = page.locator("#confirm-dialog")
        expect(dialog).to_contain_text("A closed thread cannot be opened again.")
        dialog.get_by_role("button", name="Close thread").click()
        expect(page.get_by_test_id("thread-status")).to_have_text("Closed")
        expect(page.get_by_test_id("composer-hint")).to_have_text(
            "This thread is closed: it takes no more messages."
        )
        expect(composer).to_be_disabled()
        assert watched.problems == []

    thread = Thread.objects.get(pk=thread.pk)
    assert thread.status == "closed" and thread.turns == 2
    texts = list(
        Message.objects.filter(thread=thread).order_by("id").values_list("text", flat=True)
    )
    assert texts == ["first", "echo: first", "are you there?", "echo: are you there?"]
    assert worker.poll() is None, processes.output(worker)
