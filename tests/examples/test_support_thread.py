"""The built-in support assistant: a conversation of turns on a real worker, offline (scripted model)."""

from __future__ import annotations

import pytest

from runs.control import approve_run
from runs.events import Actor
from runs.models import Message, Run, Step, Thread
from runs.threads import create_thread, post_thread_message
from tests.support.waiting import wait_until

CUSTOMER = Actor(type="user", id="42")


def turn(thread: Thread, number: int) -> Run:
    return wait_until(
        lambda: Run.objects.filter(thread=thread, turn=number).first(), what=f"turn {number}"
    )


def settled(thread: Thread, status: str = "asleep") -> Thread:
    return wait_until(
        lambda: (t := Thread.objects.get(pk=thread.pk)).status == status and t,
        timeout=30,
        what=f"the thread to be {status}",
    )


@pytest.mark.django_db(transaction=True)
def test_a_support_conversation_remembers_asks_a_person_for_a_credit_and_closes(tenant, processes):
    processes.worker("--poll", "0.2")
    thread, posted, _ = create_thread(
        tenant=tenant,
        kind="support_assistant",
        actor=CUSTOMER,
        title="Duplicate charge",
        message="How do retries and backoff work?",
    )
    assert posted is not None and posted.delivered == "new_turn"
    thread = settled(thread)
    first = Message.objects.filter(thread=thread, author_type="agent").get()
    assert "[retries-and-backoff]" in first.text
    assert thread.state["goal"] == "How do retries and backoff work?"
    assert thread.state["facts"] == ["1: retries-and-backoff"]

    # A credit: the turn waits for a person inside it, then answers.
    post_thread_message(
        thread=thread, text="I was charged twice, please refund 1200", actor=CUSTOMER
    )
    second = wait_until(
        lambda: (run := turn(thread, 2)).status == "waiting_human" and run,
        timeout=30,
        what=lambda: (
            "turn 2 to wait for the credit's approval; it is "
            + f"{turn(thread, 2).status} {turn(thread, 2).error} "
            + str(
                list(
                    Step.objects.filter(run=turn(thread, 2)).values_list("name", "status", "output")
                )
            )
        ),
    )
    assert Thread.objects.get(pk=thread.pk).status == "active"
    approve_run(run=second, actor=Actor(type="user", id="1"), comment="ok")
    thread = settled(thread)
    reply = Message.objects.filter(thread=thread, author_type="agent").order_by("-id")[0]
    assert reply.text.startswith("Done: a credit of 1200 cents")
    assert thread.state["credits_cents"] == 1200
    assert "credit issued" in thread.state["risk_flags"]
    # The model of turn 2 was shown turn 1 (the customer's line and the reply) before its prompt.
    thinking = Step.objects.filter(run=second, kind="llm").order_by("seq").first()
    assert thinking.input["kwargs"]["request"]["messages"] == 5

    # Goodbye: the reply, then the thread closes.
    post_thread_message(thread=thread, text="thanks, that's all", actor=CUSTOMER)
    thread = settled(thread, "closed")
    assert thread.summary.startswith("Closed after 3 turns")
    assert Message.objects.filter(thread=thread, author_type="agent").count() == 3


def test_the_demo_seed_starts_one_support_conversation(db):
    from runs.seed import seed_demo

    seed_demo()
    seed_demo()  # a second `make run` finds it
    (thread,) = Thread.objects.all()
    assert (thread.kind, thread.status) == ("support_assistant", "active")
    assert Run.objects.filter(thread=thread, turn=1, status="queued").exists()
