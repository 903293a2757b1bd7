"""Turns of a conversation played by real worker processes: waking, double-texting, crashes, concurrency.

The kind ``thread_echo`` (tests/support/agents_threads.py) notes what each
turn read and did in a log; a gate file per turn holds it mid-step.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from runs.events import Actor
from runs.models import Event, Message, Run, Step, Thread
from runs.threads import close_thread, create_thread, post_thread_message
from tests.support.agents import notes
from tests.support.waiting import wait_until
from tests.support.web import SSE, Web, bearer, read_events

pytestmark = pytest.mark.django_db(transaction=True)

PERSON = Actor(type="user", id="1")


def worker(processes, *args, lease: str = "4"):
    return processes.worker("--poll", "0.2", "--lease", lease, "--heartbeat", "1", *args)


class Conversation:
    """One thread of ``thread_echo`` and the files that watch and hold its turns."""

    def __init__(self, tenant, tmp_path: Path, *, policy: str = "interleave", **state):
        self.log = str(tmp_path / "log")
        self.gate = tmp_path / "gate"
        self.gate.mkdir(exist_ok=True)
        self.thread, _, _ = create_thread(
            tenant=tenant,
            kind="thread_echo",
            actor=PERSON,
            policy=policy,
            state={"log": self.log, "gate": str(self.gate)} | state,
        )

    def hold(self, turn: int) -> None:
        (self.gate / str(turn)).touch()

    def release(self, turn: int) -> None:
        (self.gate / str(turn)).unlink(missing_ok=True)

    def post(self, text: str, **options):
        return post_thread_message(thread=self.thread, text=text, actor=PERSON, **options)

    def turn(self, number: int) -> Run:
        return Run.objects.get(thread=self.thread, turn=number)

    def fresh(self) -> Thread:
        return Thread.objects.get(pk=self.thread.pk)

    def noted(self, **match) -> list[dict]:
        return notes(self.log, **match)

    def wait_for(self, turn: int, event: str, what: str = "", timeout: float = 20) -> dict:
        wait_until(
            lambda: self.noted(turn=turn, event=event),
            timeout=timeout,
            what=what or f"turn {turn} to note {event}",
        )
        return self.noted(turn=turn, event=event)[-1]

    def wait_asleep(self, timeout: float = 20) -> Thread:
        wait_until(
            lambda: self.fresh().status == "asleep", timeout=timeout, what="the thread to sleep"
        )
        return self.fresh()


def test_a_mention_wakes_an_asleep_thread_and_a_message_without_one_does_not(
    tenant, processes, tmp_path
):
    talk = Conversation(tenant, tmp_path)
    worker(processes)
    assert talk.post("just so you know", mention=False).delivered == "recorded"
    time.sleep(1.5)  # a worker polls meanwhile: nothing is there to wake
    assert not Run.objects.filter(thread=talk.thread).exists()
    assert talk.fresh().status == "asleep"

    woke = talk.post("@agent what now?")
    assert woke.delivered == "new_turn"
    end = talk.wait_for(1, "end")
    assert end["texts"] == ["just so you know", "@agent what now?"]
    thread = talk.wait_asleep()
    assert thread.state["turns_ended"] == 1 and thread.state["last"] == "@agent what now?"
    reply = Message.objects.get(thread=thread, author_type="agent")
    assert reply.text == "echo: just so you know | @agent what now?"
    asleep = Event.objects.get(run=talk.turn(1), type="thread.asleep")
    assert asleep.payload["reply"] == reply.text and asleep.payload["turn"] == 1
    # Each message was read once, by the step of turn 1 that read it.
    read = Message.objects.filter(thread=thread).exclude(author_type="agent")
    assert {m.consumed_by_step.run_id for m in read} == {talk.turn(1).pk}

    # A second mention: turn 2, which finds the state turn 1 left and sees the history.
    talk.post("and now?")
    end = talk.wait_for(2, "end")
    assert end["texts"] == ["and now?"]
    assert end["history"] == [
        "just so you know",
        "@agent what now?",
        "echo: just so you know | @agent what now?",
        "and now?",
    ]
    assert talk.wait_asleep().state["turns_ended"] == 2


def test_interleave_the_live_turn_reads_the_message_at_its_next_message_step(
    tenant, processes, tmp_path
):
    talk = Conversation(tenant, tmp_path, policy="interleave")
    talk.hold(1)
    worker(processes)
    talk.post("first")
    talk.wait_for(1, "work", "turn 1 to be mid-step")
    posted = talk.post("second")
    assert (posted.delivered, posted.run.pk) == ("live_turn", talk.turn(1).pk)
    talk.release(1)
    assert talk.wait_for(1, "end")["texts"] == ["first", "second"]
    talk.wait_asleep()
    assert Run.objects.filter(thread=talk.thread).count() == 1


def test_enqueue_runs_a_second_turn_after_the_first(tenant, processes, tmp_path):
    talk = Conversation(tenant, tmp_path, policy="enqueue")
    talk.hold(1)
    worker(processes)
    worker(processes)  # a second worker, idle: it must not take turn 2 early
    talk.post("first")
    talk.wait_for(1, "work", "turn 1 to be mid-step")
    posted = talk.post("second")
    assert (posted.delivered, posted.run.turn) == ("queued_turn", 2)
    time.sleep(1)
    assert talk.turn(2).status == "waiting" and not talk.noted(turn=2)
    talk.release(1)
    first_end = talk.wait_for(1, "end")
    second_start = talk.wait_for(2, "start")
    assert first_end["texts"] == ["first"] and second_start["texts"] == ["second"]
    assert first_end["at"] < second_start["at"]
    assert talk.wait_asleep().state["turns_ended"] == 2


def test_interrupt_cancels_the_live_turn_at_its_next_step_and_the_next_sees_both(
    tenant, processes, tmp_path
):
    talk = Conversation(tenant, tmp_path, policy="interrupt")
    talk.hold(1)
    worker(processes)
    talk.post("first")
    talk.wait_for(1, "work", "turn 1 to be mid-step")
    posted = talk.post("actually, this instead")
    assert (posted.delivered, posted.run.turn) == ("new_turn", 2)
    assert talk.turn(1).cancel_requested_at is not None
    talk.release(1)
    end = talk.wait_for(2, "end")
    first = talk.turn(1)
    assert first.status == "cancelled"
    # Its finished steps are kept; it never got to its reply or state patch.
    assert Step.objects.get(run=first, name="work").status == "done"
    assert not talk.noted(turn=1, event="end")
    # The second turn reads the new message and sees both in the history.
    assert end["texts"] == ["actually, this instead"]
    assert end["history"][:2] == ["first", "actually, this instead"]
    # The cancelled turn left the state as it found it: only turn 2 counted.
    assert talk.wait_asleep().state["turns_ended"] == 1


def test_rollback_runs_the_live_turns_compensations_before_the_next_turn(
    tenant, processes, tmp_path
):
    talk = Conversation(tenant, tmp_path, policy="rollback")
    talk.hold(1)
    worker(processes)
    talk.post("book it")
    talk.wait_for(1, "work", "turn 1 to be mid-step")
    assert talk.post("no, cancel that").delivered == "new_turn"
    talk.release(1)
    second = talk.wait_for(2, "start")
    (undo,) = talk.noted(turn=1, event="undo")
    assert undo["resource"] == "r1" and undo["at"] < second["at"]
    first = talk.turn(1)
    assert (first.status, first.compensation) == ("cancelled", "done")
    talk.wait_asleep()


def test_reject_answers_409_naming_the_live_turn(tenant, processes, tmp_path, api):
    talk = Conversation(tenant, tmp_path, policy="reject")
    talk.hold(1)
    worker(processes)
    talk.post("first")
    talk.wait_for(1, "work", "turn 1 to be mid-step")
    response = api.post(
        f"/api/threads/{talk.thread.pk}/messages",
        data={"text": "hello??"},
        content_type="application/json",
    )
    assert response.status_code == 409
    assert response.json()["run_id"] == str(talk.turn(1).pk)
    talk.release(1)
    assert talk.wait_for(1, "end")["texts"] == ["first"]
    talk.wait_asleep()
    assert Run.objects.filter(thread=talk.thread).count() == 1


def test_a_turn_killed_mid_step_resumes_from_its_step_log(tenant, processes, tmp_path):
    talk = Conversation(tenant, tmp_path)
    talk.hold(1)
    victim = worker(processes, lease="3")
    processes.manage("reap", "--interval", "0.5")
    talk.post("hello")
    talk.wait_for(1, "work", "turn 1 to be mid-step")
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    worker(processes, lease="3")
    wait_until(lambda: len(talk.noted(turn=1, event="work")) == 2, timeout=30, what="the retry")
    talk.release(1)
    end = talk.wait_for(1, "end")
    assert end["texts"] == ["hello"]  # the message step replayed: read once, not again
    thread = talk.wait_asleep()
    assert thread.state["turns_ended"] == 1
    run = talk.turn(1)
    assert run.attempt == 2
    steps = list(Step.objects.filter(run=run).order_by("seq"))
    assert [(s.name, s.kind) for s in steps] == [
        ("messages", "message"),
        ("work", "custom"),
        ("messages", "message"),
        ("history", "custom"),
        ("update_state", "state"),
        ("reply", "reply"),
    ]
    # What finished before the kill replayed; the step it killed ran again (twice in the log).
    assert steps[0].executions == 1 and len(talk.noted(turn=1, event="start")) == 2
    assert Message.objects.filter(thread=thread, author_type="agent").count() == 1
    assert Event.objects.filter(run=run, type="thread.asleep").count() == 1


def test_a_failed_turn_leaves_the_state_as_it_found_it(tenant, processes, tmp_path):
    talk = Conversation(tenant, tmp_path, turns_ended=5)
    worker(processes)
    talk.post("fail")
    thread = talk.wait_asleep()
    assert talk.turn(1).status == "failed"
    assert thread.state["turns_ended"] == 5 and "last" not in thread.state
    # The reply it said stays in the conversation; the thread listens again.
    talk.post("are you ok?")
    talk.wait_for(2, "end")
    assert talk.wait_asleep().state["turns_ended"] == 6


def test_close_thread_ends_the_conversation_when_the_turn_ends_well(tenant, processes, tmp_path):
    talk = Conversation(tenant, tmp_path)
    worker(processes)
    talk.post("close")
    wait_until(lambda: talk.fresh().status == "closed", timeout=20, what="the thread to close")
    thread = talk.fresh()
    assert thread.summary == "closed on request" and thread.live_turn is None
    assert Event.objects.filter(run=talk.turn(1), type="thread.closed").exists()


def test_twenty_messages_from_four_clients_under_enqueue_never_run_two_turns_at_once(
    tenant, processes, tmp_path, api_key
):
    talk = Conversation(tenant, tmp_path, policy="enqueue", gate=None)
    web = Web(processes).start()
    for _ in range(3):
        worker(processes, lease="3")
    processes.manage("reap", "--interval", "0.5")

    running: list[int] = []
    sampling = True

    def sample() -> None:
        from django.db import connection

        while sampling:
            running.append(Run.objects.filter(thread=talk.thread, status="running").count())
            time.sleep(0.01)
        connection.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    answers: list[dict] = []

    def client(n: int) -> None:
        with httpx.Client(base_url=web.base, headers=bearer(api_key), timeout=30) as http:
            for i in range(5):
                response = http.post(
                    f"/api/threads/{talk.thread.pk}/messages", json={"text": f"c{n}-m{i}"}
                )
                assert response.status_code == 202, response.text
                answers.append(response.json())

    clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for c in clients:
        c.start()
    for c in clients:
        c.join(60)
    try:
        wait_until(
            lambda: (
                talk.fresh().status == "asleep"
                and len(talk.noted(event="end")) == Run.objects.filter(thread=talk.thread).count()
            ),
            timeout=90,
            what="every turn to end",
        )
    finally:
        sampling = False
        sampler.join(10)

    assert len(answers) == 20
    assert max(running) == 1 and len(running) > 50
    # Turns ran one after another, in number order, without overlapping.
    ends = {n["turn"]: n for n in talk.noted(event="end")}
    starts = {n["turn"]: n for n in talk.noted(event="start")}
    order = sorted(starts)
    assert order == list(range(1, len(order) + 1))
    for a, b in zip(order, order[1:], strict=False):
        assert ends[a]["at"] <= starts[b]["at"]
    # Every message was read exactly once, by exactly one turn.
    read = [text for n in talk.noted(event="end") for text in n["texts"]]
    assert sorted(read) == sorted(f"c{n}-m{i}" for n in range(4) for i in range(5))
    people = Message.objects.filter(thread=talk.thread).exclude(author_type="agent")
    assert people.count() == 20 and not people.filter(consumed_by_step__isnull=True).exists()


def test_the_stream_of_a_thread_crosses_turns_and_resumes_with_last_event_id(
    tenant, processes, tmp_path, api_key
):
    talk = Conversation(tenant, tmp_path, gate=None)
    web = Web(processes).start()
    worker(processes)
    url = f"{web.base}/api/threads/{talk.thread.pk}/events"
    seen: list[SSE] = []
    with httpx.stream("GET", url, headers=bearer(api_key), timeout=30) as response:
        assert response.status_code == 200
        talk.post("one")
        read_events(response, seen=seen, until=lambda e: e.event == "thread.asleep")
        talk.post("two")
        read_events(
            response,
            seen=seen,
            until=lambda e: e.event == "thread.asleep" and e.data["data"]["turn"] == 2,
        )
    ids = [e.id for e in seen]
    assert ids[0] == "1.1" and ids[-1].startswith("2.")
    turns = [int(i.split(".")[0]) for i in ids]
    assert turns == sorted(turns) and set(turns) == {1, 2}
    types = [e.event for e in seen]
    assert types.count("thread.reply") == 2 and types.count("thread.asleep") == 2
    replies = [e.data["data"]["text"] for e in seen if e.event == "thread.reply"]
    assert replies == ["echo: one", "echo: two"]

    # Resumed from the middle of turn 1: the rest of turn 1, then turn 2, nothing twice.
    middle = ids.index("1.3")
    again: list[SSE] = []
    with httpx.stream(
        "GET", url, headers=bearer(api_key) | {"Last-Event-ID": "1.3"}, timeout=30
    ) as response:
        read_events(
            response,
            seen=again,
            until=lambda e: e.event == "thread.asleep" and e.data["data"]["turn"] == 2,
        )
    assert [e.id for e in again] == ids[middle + 1 :]

    # Closing the thread ends the stream (after thread.closed), for a client following it.
    closing: list[SSE] = []
    with httpx.stream(
        "GET", url, headers=bearer(api_key) | {"Last-Event-ID": ids[-1]}, timeout=30
    ) as response:
        close_thread(thread=talk.thread, actor=PERSON, summary="bye")
        read_events(response, seen=closing)  # returns when the server ends the stream
    assert [e.event for e in closing] == ["thread.closed"]

    # A malformed Last-Event-ID is a 422, another tenant's thread a 404.
    bad = httpx.get(url, headers=bearer(api_key) | {"Last-Event-ID": "seven"}, timeout=10)
    assert bad.status_code == 422 and "turn" in bad.json()["detail"]
    other = httpx.get(
        f"{web.base}/api/threads/{uuid.uuid4()}/events", headers=bearer(api_key), timeout=10
    )
    assert other.status_code == 404
