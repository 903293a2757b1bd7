"""The dashboard's conversation pages through Django's test client: the thread list, the New thread form,
a thread's page (its turns, its composer's sentence, its live parts), posting, closing, and who may do what.

No worker runs here: a turn stays as the services leave it (queued, or held
behind the live one), and a turn's reply, step or approval is written as a
turn would leave it.
"""

from __future__ import annotations

import html as html_lib
import re
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.test import AsyncClient, Client
from django.test.utils import CaptureQueriesContext

from runs.dashboard import threads as thread_views
from runs.events import Actor
from runs.models import Membership, Message, Run, Step, Thread
from runs.threads import close_thread, create_thread, post_thread_message
from tests.support.factories import MembershipFactory, TenantFactory
from tests.support.run_states import force_status

pytestmark = pytest.mark.django_db

HTMX = {"HX-Request": "true"}
PERSON = Actor(type="user", id="1")


def login(role: str = Membership.Role.OPERATOR, tenant=None) -> tuple[Client, Membership]:
    membership = MembershipFactory(role=role, **({"tenant": tenant} if tenant else {}))
    client = Client()
    client.force_login(membership.user)
    return client, membership


def new_thread(tenant, *, policy: str = "interleave", message: str | None = None, **fields):
    thread, _, _ = create_thread(
        tenant=tenant,
        kind="thread_echo",
        actor=PERSON,
        policy=policy,
        state={},
        message=message,
        **fields,
    )
    return Thread.objects.get(pk=thread.pk)


def page_of(thread) -> str:
    return f"/threads/{thread.pk}/"


def text_of(response) -> str:
    """The page's text as a person reads it: tags dropped, entities decoded, white space collapsed."""
    content = response.content.decode()
    content = re.sub(r"<script.*?</script>", " ", content, flags=re.S)
    return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", content)).split())


def hint(response) -> tuple[str, str, str]:
    """The composer's sentence as shown, and its two versions (with and without a mention)."""
    content = response.content.decode()
    found = re.search(
        r'<p id="composer-hint"[^>]*data-mention="([^"]*)" data-silent="([^"]*)"[^>]*>([^<]*)</p>',
        content,
    )
    assert found, "no composer sentence on the page"
    mention, silent, shown = (html_lib.unescape(part) for part in found.groups())
    return shown, mention, silent


def flashes(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def turn(thread, number: int) -> Run:
    return Run.objects.get(thread=thread, turn=number)


def reply(thread, run: Run, text: str) -> Message:
    """A turn's reply, as ctx.reply writes it."""
    return Message.objects.create(
        thread=thread, run=run, author_type="agent", author_id=thread.kind, text=text
    )


# The list


def test_the_list_shows_the_tenants_threads_newest_first_and_nothing_of_another_tenant():
    client, member = login("viewer")
    older = new_thread(member.tenant, title="Refund for order 1001")
    newer = new_thread(member.tenant, message="hello")  # no title: the kind names it
    elsewhere = new_thread(TenantFactory(), title="Another tenant's secret")

    response = client.get("/threads/")
    assert response.status_code == 200
    rows = re.findall(r'<tr id="thread-([0-9a-f-]+)"', response.content.decode())
    assert rows == [str(newer.pk), str(older.pk)]
    text = text_of(response)
    assert "Refund for order 1001" in text and "Another tenant's secret" not in text
    row = re.search(
        rf'<tr id="thread-{newer.pk}".*?</tr>', response.content.decode(), flags=re.S
    ).group(0)
    row_text = " ".join(html_lib.unescape(re.sub(r"<[^>]+>", " ", row)).split())
    assert row_text.startswith("thread_echo thread_echo")  # title (the kind), then the kind tag
    assert "Active turn 1 live" in row_text and "interleave" in row_text
    assert '<td data-label="Turns">1</td>' in row
    assert "0¢" in row_text and "s ago" in row_text
    # A viewer starts nothing.
    assert "New thread" not in text

    # Another tenant's thread does not exist, by any of its addresses.
    for url in (
        page_of(elsewhere),
        f"/threads/{elsewhere.pk}/conversation/",
    ):
        assert client.get(url).status_code == 404
    for url in (f"/threads/{elsewhere.pk}/messages/", f"/threads/{elsewhere.pk}/close/"):
        assert client.post(url, {"text": "hi", "confirmed": "1"}).status_code == 404
    assert Message.objects.filter(thread=elsewhere).count() == 0
    assert Thread.objects.get(pk=elsewhere.pk).status == "asleep"


def test_the_list_filters_by_status_and_pages_with_a_cursor(monkeypatch):
    monkeypatch.setattr(thread_views, "PAGE_SIZE", 2)
    client, member = login("viewer")
    made = [new_thread(member.tenant, title=f"Thread {n}") for n in range(3)]
    close_thread(thread=made[0], actor=PERSON, summary="done with it")

    first = client.get("/threads/")
    titles = re.findall(r'class="run-title">([^<]+)<', first.content.decode())
    assert titles == ["Thread 2", "Thread 1"]
    next_url = re.search(r'<a href="([^"]+)" rel="next">Older threads', first.content.decode())
    second = client.get("/threads/" + html_lib.unescape(next_url.group(1)))
    assert re.findall(r'class="run-title">([^<]+)<', second.content.decode()) == ["Thread 0"]
    assert 'rel="next"' not in second.content.decode()

    closed = client.get("/threads/?status=closed")
    assert re.findall(r'class="run-title">([^<]+)<', closed.content.decode()) == ["Thread 0"]
    assert "done with it" in text_of(closed)
    asleep = client.get("/threads/?status=asleep")
    assert re.findall(r'class="run-title">([^<]+)<', asleep.content.decode()) == [
        "Thread 2",
        "Thread 1",
    ]
    # A bad filter or a mangled cursor is a sentence, not a 500.
    assert client.get("/threads/?status=sideways").status_code == 200
    damaged = client.get("/threads/?cursor=not-a-cursor")
    assert damaged.status_code == 200 and "invalid cursor" in text_of(damaged)


def test_the_list_polls_while_a_turn_is_live_and_stops_when_none_is():
    client, member = login("viewer")
    asleep = new_thread(member.tenant)
    page = client.get("/threads/").content.decode()
    assert "hx-get" not in page.split('id="threads"')[1].split(">")[0]
    post_thread_message(thread=asleep, text="wake up", actor=PERSON)
    page = client.get("/threads/").content.decode()
    assert 'hx-trigger="every 2s, visibilitychange from:document"' in page
    assert client.get("/threads/", headers=HTMX).status_code == 200
    Thread.objects.filter(pk=asleep.pk).update(status="closed", live_turn=None)
    assert client.get("/threads/", headers=HTMX).status_code == 286


# Starting a thread


def test_an_operator_starts_a_thread_from_the_form_and_lands_on_it():
    client, member = login("operator")
    form = client.get("/threads/new/")
    assert form.status_code == 200
    kinds = re.findall(r'<option value="([^"]+)"', form.content.decode().split('name="kind"')[1])
    # Only the kinds that can play a thread's turns: one whose input a turn's does not fit is not offered.
    assert "thread_echo" in kinds and "support_assistant" in kinds
    assert "echo" not in kinds
    assert (
        '<option value="" selected>Choose an agent</option>' in form.content.decode()
    )  # none picked
    key = re.search(r'name="idempotency_key" value="([^"]+)"', form.content.decode()).group(1)

    data = {
        "idempotency_key": key,
        "kind": "thread_echo",
        "title": "Order A-1001",
        "policy": "enqueue",
        "message": "Where is my order?",
        "cost_ceiling_cents": "250",
    }
    response = client.post("/threads/new/", data, follow=True)
    thread = Thread.objects.get(tenant=member.tenant)
    assert response.redirect_chain == [(page_of(thread), 302)]
    assert (thread.kind, thread.title, thread.policy, thread.status) == (
        "thread_echo",
        "Order A-1001",
        "enqueue",
        "active",
    )
    assert thread.cost_ceiling_cents == Decimal(250)
    assert flashes(response) == ["Thread started: the agent is reading your message."]
    (line,) = Message.objects.filter(thread=thread)
    assert (line.text, line.mention, line.run_id, line.author_id) == (
        "Where is my order?",
        True,
        turn(thread, 1).pk,
        str(member.user.pk),
    )
    assert "Where is my order?" in text_of(response)

    # The same form sent again finds its thread instead of starting a second one.
    again = client.post("/threads/new/", data, follow=True)
    assert again.redirect_chain == [(page_of(thread), 302)]
    assert flashes(again) == ["This form was already sent: here is its thread."]
    assert Thread.objects.filter(tenant=member.tenant).count() == 1

    # Without a first message it opens asleep.
    quiet = client.post(
        "/threads/new/", {"idempotency_key": "k2", "kind": "thread_echo", "policy": "reject"}
    )
    assert quiet.status_code == 302
    assert Thread.objects.get(tenant=member.tenant, idempotency_key="k2").status == "asleep"


def test_the_new_thread_form_shows_its_errors_and_never_fails():
    client, member = login("operator")
    missing = client.post("/threads/new/", {"idempotency_key": "a", "policy": "interleave"})
    assert missing.status_code == 422
    assert "This field is required." in text_of(missing)
    not_offered = client.post(
        "/threads/new/", {"idempotency_key": "b", "kind": "echo", "policy": "interleave"}
    )
    assert not_offered.status_code == 422
    assert "Select a valid choice. echo is not one of the available choices." in text_of(
        not_offered
    )
    bad_policy = client.post(
        "/threads/new/", {"idempotency_key": "c", "kind": "thread_echo", "policy": "shout"}
    )
    assert bad_policy.status_code == 422
    blank = client.post(
        "/threads/new/",
        {"idempotency_key": "d", "kind": "thread_echo", "policy": "enqueue", "message": "   "},
    )
    assert blank.status_code == 302  # blank is no first message: the thread opens asleep
    # A key used for another request is refused, with a fresh key to send again.
    conflict = client.post(
        "/threads/new/",
        {"idempotency_key": "d", "kind": "thread_echo", "policy": "reject", "title": "other"},
    )
    assert conflict.status_code == 422
    assert "already used to start another thread" in text_of(conflict)
    assert 'name="idempotency_key" value="d"' not in conflict.content.decode()
    assert Thread.objects.filter(tenant=member.tenant).count() == 1


def test_a_viewer_may_not_start_a_thread():
    client, member = login("viewer")
    assert client.get("/threads/new/").status_code == 403
    response = client.post(
        "/threads/new/", {"idempotency_key": "a", "kind": "thread_echo", "policy": "interleave"}
    )
    assert response.status_code == 403
    assert not Thread.objects.exists()


# The composer's sentence


def test_the_composer_says_what_a_message_does_for_each_policy_and_state():
    client, member = login("operator")
    thread = new_thread(member.tenant, policy="interleave")
    shown, mention, silent = hint(client.get(page_of(thread)))
    assert shown == mention == "Your message starts turn 1."
    assert silent == "Your message is recorded for the next turn; nothing wakes."

    post_thread_message(thread=thread, text="first", actor=PERSON)  # turn 1 is live
    expected = {
        "interleave": "Your message goes to the live turn 1, read at its next message step.",
        "enqueue": "Your message queues turn 2 to run after turn 1.",
        "interrupt": "Your message cancels turn 1 at its next step and starts turn 2 with every "
        "unread message.",
        "rollback": "Your message rolls back turn 1 (its compensations run) then starts turn 2.",
        "reject": "Your message is refused while turn 1 is live.",
    }
    for policy, words in expected.items():
        Thread.objects.filter(pk=thread.pk).update(policy=policy)
        shown, mention, silent = hint(client.get(page_of(thread)))
        assert shown == mention == silent == words, policy

    # Turns held behind the live one: the next message queues after the last of them.
    Thread.objects.filter(pk=thread.pk).update(policy="enqueue")
    post_thread_message(thread=thread, text="second", actor=PERSON)
    shown, _, _ = hint(client.get(page_of(thread)))
    assert shown == "Your message queues turn 3 to run after turn 2."

    # Asleep after two turns: the next mention starts turn 3.
    Thread.objects.filter(pk=thread.pk).update(status="asleep", live_turn=None)
    shown, _, _ = hint(client.get(page_of(thread)))
    assert shown == "Your message starts turn 3."

    # A spent budget: a message that would start a turn is refused, and the sentence says so.
    Thread.objects.filter(pk=thread.pk).update(cost_ceiling_cents=1, cost_cents=1)
    shown, mention, silent = hint(client.get(page_of(thread)))
    assert mention == (
        "Your message starts turn 3. But the thread's cost ceiling is spent: no new turn can start, "
        "so it will be refused."
    )
    assert silent == "Your message is recorded for the next turn; nothing wakes."

    close_thread(thread=thread, actor=PERSON)
    response = client.get(page_of(thread))
    shown, _, _ = hint(response)
    assert shown == "This thread is closed: it takes no more messages."
    assert re.search(r'<fieldset class="composer-fields" disabled>', response.content.decode())


def test_the_sentence_follows_an_unticked_mention_when_the_page_comes_back_with_an_error():
    client, member = login("operator")
    thread = new_thread(member.tenant)
    response = client.post(f"/threads/{thread.pk}/messages/", {"text": "   "})  # mention unticked
    assert response.status_code == 422
    shown, _, silent = hint(response)
    assert shown == silent == "Your message is recorded for the next turn; nothing wakes."
    assert 'id="composer-mention"' in response.content.decode()
    assert (
        " checked" not in response.content.decode().split('id="composer-mention"')[1].split(">")[0]
    )


# Posting


def test_posting_does_what_the_sentence_said_for_each_outcome():
    client, member = login("operator")
    thread = new_thread(member.tenant)
    url = f"/threads/{thread.pk}/messages/"

    # Asleep without a mention: recorded; nothing wakes.
    response = client.post(url, {"text": "for later"}, follow=True)
    assert response.redirect_chain == [(page_of(thread), 302)]
    assert flashes(response) == ["Message recorded for the next turn; the agent was not woken."]
    assert not Run.objects.filter(thread=thread).exists()
    assert "For the next turn" in text_of(response) and "for later" in text_of(response)

    # Asleep with a mention: turn 1 starts, with both messages.
    response = client.post(url, {"text": "now please", "mention": "on"}, follow=True)
    assert flashes(response) == ["Message sent: it starts turn 1."]
    first = turn(thread, 1)
    assert set(Message.objects.filter(thread=thread).values_list("run_id", flat=True)) == {first.pk}

    # Active, interleave: into the live turn.
    response = client.post(url, {"text": "one more thing", "mention": "on"}, follow=True)
    assert flashes(response) == ["Message sent to the live turn 1."]
    assert Message.objects.get(text="one more thing").run_id == first.pk
    assert "not read yet" in text_of(response)

    # Enqueue: a new turn after the live one.
    Thread.objects.filter(pk=thread.pk).update(policy="enqueue")
    response = client.post(url, {"text": "queued", "mention": "on"}, follow=True)
    assert flashes(response) == ["Message sent: turn 2 runs after the turns before it."]
    assert turn(thread, 2).status == "waiting"
    assert "after turn 1" in text_of(response)

    # Reject: refused, readable, nothing written; what was typed stays in the composer.
    Thread.objects.filter(pk=thread.pk).update(policy="reject")
    before = Message.objects.count()
    response = client.post(url, {"text": "are you there?", "mention": "on"})
    assert response.status_code == 409
    assert (
        "Not sent: turn 1 is live, and this thread's policy (reject) refuses messages until it "
        "ends." in text_of(response)
    )
    assert ">are you there?</textarea>" in response.content.decode()
    assert Message.objects.count() == before

    # Interrupt: the live turn is cancelled (a queued turn at once), the new turn takes over.
    Thread.objects.filter(pk=thread.pk).update(policy="interrupt")
    response = client.post(url, {"text": "stop, do this", "mention": "on"}, follow=True)
    assert flashes(response) == ["Message sent: it starts turn 3."]
    assert turn(thread, 1).status == "cancelled"

    # Empty text: a form error, nothing written.
    for blank in ("", "  \n "):
        response = client.post(url, {"text": blank, "mention": "on"})
        assert response.status_code == 422
        assert "Write something first: an empty message is not sent." in text_of(response)
    too_long = client.post(url, {"text": "x" * 20_001, "mention": "on"})
    assert too_long.status_code == 422
    assert "Ensure this value has at most 20000 characters" in text_of(too_long)

    # Closed: refused, readable.
    close_thread(thread=thread, actor=PERSON)
    before = Message.objects.count()
    response = client.post(url, {"text": "hello?", "mention": "on"})
    assert response.status_code == 409
    assert "Not sent: this thread is closed, so it takes no more messages." in text_of(response)
    assert Message.objects.count() == before


def test_rollback_and_a_spent_budget():
    client, member = login("operator")
    thread = new_thread(member.tenant, policy="rollback", message="first")
    url = f"/threads/{thread.pk}/messages/"
    response = client.post(url, {"text": "undo that", "mention": "on"}, follow=True)
    assert flashes(response) == ["Message sent: it starts turn 2."]
    assert turn(thread, 1).status == "cancelled"

    spent = new_thread(member.tenant, cost_ceiling_cents=5)
    Thread.objects.filter(pk=spent.pk).update(cost_cents=5)
    response = client.post(f"/threads/{spent.pk}/messages/", {"text": "hi", "mention": "on"})
    assert response.status_code == 409
    assert "Not sent: the thread's cost ceiling is spent (5¢ of 5¢)" in text_of(response)
    assert not Message.objects.filter(thread=spent).exists()
    # Without a mention nothing needs the budget: it is kept for later.
    assert client.post(f"/threads/{spent.pk}/messages/", {"text": "hi"}).status_code == 302


def test_through_htmx_the_composer_comes_back_in_place_with_the_conversation():
    client, member = login("operator")
    thread = new_thread(member.tenant)
    url = f"/threads/{thread.pk}/messages/"
    sent = client.post(url, {"text": "hello agent", "mention": "on"}, headers=HTMX)
    assert sent.status_code == 200
    content = sent.content.decode()
    assert content.lstrip().startswith('<section id="composer"')
    assert "Message sent: it starts turn 1." in content
    assert "></textarea>" in content  # emptied for the next message
    assert '<section id="conversation"' in content and "hello agent" in content
    conversation = content.split('<section id="conversation"')[1].split(">")[0]
    assert 'hx-swap-oob="true"' in conversation
    assert (
        '<section id="thread-head" class="card thread-head" aria-label="The thread" hx-swap-oob="true">'
        in content
    )
    # Its sentence already says what the next message does.
    assert "Your message goes to the live turn 1, read at its next message step." in content

    Thread.objects.filter(pk=thread.pk).update(policy="reject")
    refused = client.post(url, {"text": "again", "mention": "on"}, headers=HTMX)
    assert refused.status_code == 409
    content = refused.content.decode()
    assert content.lstrip().startswith('<section id="composer"')
    assert "Not sent: turn 1 is live" in content and ">again</textarea>" in content
    assert "<html" not in content and 'id="conversation"' not in content
    empty = client.post(url, {"text": ""}, headers=HTMX)
    assert empty.status_code == 422 and "Write something first" in empty.content.decode()


def test_a_viewer_reads_the_conversation_but_cannot_post_or_close():
    client, member = login("viewer")
    thread = new_thread(member.tenant, message="hi")
    response = client.get(page_of(thread))
    assert response.status_code == 200
    content = response.content.decode()
    assert 'id="composer-text"' not in content and "Close thread" not in content
    assert "Your role (viewer) may read this conversation" in text_of(response)
    assert (
        client.post(f"/threads/{thread.pk}/messages/", {"text": "x", "mention": "on"}).status_code
        == 403
    )
    assert client.post(f"/threads/{thread.pk}/close/", {"confirmed": "1"}).status_code == 403
    assert Message.objects.filter(thread=thread).count() == 1
    assert Thread.objects.get(pk=thread.pk).status == "active"


# Closing


def test_closing_asks_first_then_closes_and_cancels_the_live_turn():
    client, member = login("operator")
    thread = new_thread(member.tenant, message="hi")
    page = client.get(page_of(thread)).content.decode()
    assert 'data-confirm-title="Close this thread?"' in page

    url = f"/threads/{thread.pk}/close/"
    asked = client.post(url, {"summary": "Answered by phone"})
    assert asked.status_code == 200
    assert "Close this thread?" in text_of(asked)
    assert 'name="summary" value="Answered by phone"' in asked.content.decode()
    assert Thread.objects.get(pk=thread.pk).status == "active"

    done = client.post(url, {"summary": "Answered by phone", "confirmed": "1"}, follow=True)
    assert done.redirect_chain == [(page_of(thread), 302)]
    assert flashes(done) == ["Thread closed: it takes no more messages."]
    closed = Thread.objects.get(pk=thread.pk)
    assert (closed.status, closed.summary) == ("closed", "Answered by phone")
    assert turn(thread, 1).status == "cancelled"
    text = text_of(done)
    assert "Closed" in text and "Answered by phone" in text
    assert "Close thread" not in text and "This thread is closed" in text

    again = client.post(url, {"confirmed": "1"}, follow=True)
    assert flashes(again) == ["Nothing changed: the thread was closed already."]


def test_a_closing_note_too_long_is_a_form_error():
    client, member = login("operator")
    thread = new_thread(member.tenant)
    response = client.post(f"/threads/{thread.pk}/close/", {"summary": "x" * 301, "confirmed": "1"})
    assert response.status_code == 422
    assert "Ensure this value has at most 300 characters" in text_of(response)
    assert Thread.objects.get(pk=thread.pk).status == "asleep"


# The page: turns, lines, steps, state, approvals


def test_the_page_reads_as_a_conversation_grouped_by_turn():
    client, member = login("viewer")
    member.user.first_name, member.user.last_name = "Ana", "Silva"
    member.user.save()
    person = Actor(type="user", id=str(member.user.pk))
    thread, _, _ = create_thread(
        tenant=member.tenant,
        kind="thread_echo",
        actor=person,
        title="Kettle",
        message="<b>broken</b> kettle",
    )
    first = turn(thread, 1)
    Step.objects.create(run=first, seq=1, name="work", kind="custom", status="done")
    Step.objects.create(run=first, seq=2, name="reply", kind="reply", status="done")
    reply(thread, first, "Sorry to hear that: **a refund** is on its way.")
    force_status(first, "done")
    Thread.objects.filter(pk=thread.pk).update(
        status="asleep",
        live_turn=None,
        state={"goal": "refund", "open_questions": ["when?", "how much?"]},
    )
    post_thread_message(thread=thread, text="thanks, no rush", actor=person, mention=False)

    response = client.get(page_of(thread))
    content = response.content.decode()
    turns = re.findall(r'<article class="turn[^"]*" id="turn-(\d+)"', content)
    assert turns == ["1"]
    section = content.split('id="turn-1"')[1].split("</article>")[0]
    # The person's line, then the agent's, each with its author; people's text is text, the agent's Markdown.
    lines = re.findall(r'data-role="(\w+)"', section)
    assert lines == ["person", "agent"]
    assert "Ana Silva" in section and "thread_echo" in section
    assert "&lt;b&gt;broken&lt;/b&gt; kettle" in section
    assert "<strong>a refund</strong>" in section
    # The turn's header: its status and its run page; its steps behind a disclosure.
    assert f'href="/runs/{first.pk}/"' in section and ">Done</span>" in section
    assert re.search(
        r'<details class="turn-steps" id="turn-1-steps"[^>]*>\s*<summary>2 steps</summary>', section
    )
    assert re.findall(r'<strong class="step-name">([^<]+)</strong>', section) == ["work", "reply"]
    # The message kept for the next turn, the state, the status.
    text = text_of(response)
    assert "For the next turn" in text and "thanks, no rush" in text and "no mention" in text
    assert "Goal refund" in text and "Open questions when? how much?" in text
    assert "Asleep" in text


def test_an_approval_inside_a_turn_is_decided_from_the_thread_page():
    client, member = login("approver")
    thread = new_thread(member.tenant, message="refund me 1200")
    first = turn(thread, 1)
    Step.objects.create(run=first, seq=1, name="thinking", kind="llm", status="done")
    Step.objects.create(
        run=first,
        seq=2,
        name="issue_credit",
        kind="approval",
        status="waiting",
        input={"proposal": {"amount_cents": 1200, "reason": "charged twice"}},
    )
    force_status(first, "waiting_human", steps_done=1, current_step="issue_credit", attempt=1)

    page = client.get(page_of(thread)).content.decode()
    card = page.split('data-testid="approval"')[1].split("</form>")[0]
    assert "Approval needed: issue_credit" in card and "charged twice" in card
    assert f'action="/runs/{first.pk}/approve/"' in card
    assert f'formaction="/runs/{first.pk}/reject/"' in card
    assert f'name="next" value="/threads/{thread.pk}/#turn-1"' in card
    assert '<input type="hidden" name="step" value="2">' in card

    response = client.post(
        f"/runs/{first.pk}/approve/",
        {"step": "2", "comment": "ok", "next": f"/threads/{thread.pk}/#turn-1"},
    )
    assert response.status_code == 302 and response["Location"] == f"/threads/{thread.pk}/#turn-1"
    assert Step.objects.get(run=first, seq=2).output["approved"] is True

    # A viewer sees the proposal, not the buttons.
    viewer, _ = login("viewer", tenant=member.tenant)
    second = new_thread(member.tenant, message="another")
    Step.objects.create(
        run=turn(second, 1),
        seq=1,
        name="issue_credit",
        kind="approval",
        status="waiting",
        input={"proposal": {"amount_cents": 5}},
    )
    force_status(turn(second, 1), "waiting_human", attempt=1)
    page = viewer.get(page_of(second)).content.decode()
    assert "Approval needed: issue_credit" in page and ">Approve</button>" not in page
    assert "An approver decides" in page


def test_an_action_goes_back_only_to_a_page_of_this_site():
    client, member = login("approver")
    thread = new_thread(member.tenant, message="refund")
    first = turn(thread, 1)
    Step.objects.create(
        run=first,
        seq=1,
        name="pay",
        kind="approval",
        status="waiting",
        input={"proposal": {"amount": 1}},
    )
    force_status(first, "waiting_human", attempt=1)
    response = client.post(
        f"/runs/{first.pk}/approve/", {"step": "1", "next": "https://evil.example/phish"}
    )
    assert response["Location"] == f"/runs/{first.pk}/"


def test_a_turns_run_page_names_its_thread():
    client, member = login("viewer")
    thread = new_thread(member.tenant, title="Kettle refund", message="hi")
    response = client.get(f"/runs/{turn(thread, 1).pk}/")
    assert "Turn 1 of thread Kettle refund" in text_of(response)
    assert f'href="/threads/{thread.pk}/"' in response.content.decode()
    plain = Run.objects.create(tenant=member.tenant, kind="echo", input={"text": "x"})
    assert "of thread" not in text_of(client.get(f"/runs/{plain.pk}/"))


def test_the_conversation_fragment_brings_the_facts_state_and_sentence_out_of_band():
    client, member = login("operator")
    thread = new_thread(member.tenant, message="hi")
    fragment = client.get(f"/threads/{thread.pk}/conversation/", headers=HTMX)
    assert fragment.status_code == 200
    content = fragment.content.decode()
    assert content.lstrip().startswith('<section id="conversation"')
    assert "<html" not in content
    for part in ('<section id="thread-head"', '<div id="thread-side"', '<p id="composer-hint"'):
        opening = content.split(part)[1].split(">")[0]
        assert 'hx-swap-oob="true"' in opening, part
    # The page without a stream (WSGI) polls it while a turn is live, and not once the thread sleeps.
    page = client.get(page_of(thread)).content.decode()
    assert f'hx-get="/threads/{thread.pk}/conversation/"' in page
    assert "data-stream-url" not in page
    Thread.objects.filter(pk=thread.pk).update(status="asleep", live_turn=None)
    assert (
        "hx-get"
        not in client.get(page_of(thread))
        .content.decode()
        .split('id="conversation"')[1]
        .split(">")[0]
    )


def test_a_page_served_by_asgi_follows_the_threads_stream_from_what_it_shows():
    member = MembershipFactory(role="viewer")
    thread = new_thread(member.tenant, policy="enqueue", message="one")
    post_thread_message(thread=thread, text="two", actor=PERSON)  # turn 2, held behind turn 1
    client = AsyncClient()
    client.force_login(member.user)
    page = async_to_sync(client.get)(page_of(thread)).content.decode()
    live = turn(thread, 1)
    # From the live turn's last Event: the held turn's Events come after it in the stream.
    assert (
        f'data-stream-url="/api/threads/{thread.pk}/events?last_event_id=1.{live.last_event_seq}"'
        in page
    )
    assert f'data-refresh-url="/threads/{thread.pk}/conversation/"' in page
    assert '<script src="/static/js/thread-stream.js" defer></script>' in page

    fresh_thread = new_thread(member.tenant)
    page = async_to_sync(client.get)(page_of(fresh_thread)).content.decode()
    assert f'data-stream-url="/api/threads/{fresh_thread.pk}/events"' in page
    close_thread(thread=fresh_thread, actor=PERSON)
    page = async_to_sync(client.get)(page_of(fresh_thread)).content.decode()
    assert "data-stream-url" not in page  # a closed thread has nothing more to tell


def test_the_page_costs_the_same_queries_however_many_turns_it_shows():
    client, member = login("viewer")
    thread = new_thread(member.tenant, policy="enqueue", message="m0")

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(page_of(thread)).status_code == 200
        return len(captured)

    few = queries()
    for n in range(1, 8):
        post_thread_message(thread=thread, text=f"m{n}", actor=PERSON)
    assert Run.objects.filter(thread=thread).count() == 8
    assert queries() == few
