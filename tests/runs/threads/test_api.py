"""The conversation API without workers: creating threads, what a message does in each state, refusals."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.test import Client

from runs.events import Actor
from runs.keys import create_api_key
from runs.models import Event, Message, Run, Thread
from runs.threads import post_thread_message
from tests.support.factories import TenantFactory

pytestmark = pytest.mark.django_db

PERSON = Actor(type="user", id="7")


def post(client: Client, path: str, body: dict | str):
    data = body if isinstance(body, str) else json.dumps(body)
    return client.post(path, data=data, content_type="application/json")


def error(response, status: int) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert isinstance(body["detail"], str) and body["detail"]
    return body


def new_thread(api, **fields) -> dict:
    response = post(api, "/api/threads", {"kind": "thread_echo"} | fields)
    assert response.status_code == 201, response.content
    return response.json()


def test_a_thread_is_created_asleep_and_a_first_message_starts_turn_one(api):
    quiet = new_thread(api, title="Billing question")
    assert (quiet["status"], quiet["live_turn"], quiet["turns"], quiet["message"]) == (
        "asleep",
        None,
        [],
        None,
    )
    started = new_thread(api, message="My invoice is wrong", policy="enqueue")
    assert started["status"] == "active" and started["policy"] == "enqueue"
    assert started["message"]["delivered"] == "new_turn"
    assert started["message"]["turn"] == 1
    run = Run.objects.get(pk=started["message"]["run_id"])
    assert (run.status, run.thread_id, run.turn, run.input) == (
        "queued",
        Thread.objects.get(pk=started["id"]).pk,
        1,
        {"thread_id": started["id"], "turn": 1},
    )
    assert Message.objects.get(pk=started["message"]["message_id"]).run_id == run.pk
    # The run's JSON names its thread and turn.
    body = api.get(f"/api/runs/{run.pk}").json()
    assert (body["thread_id"], body["turn"]) == (started["id"], 1)
    detail = api.get(f"/api/threads/{started['id']}").json()
    assert detail["turns"] == [
        {"turn": 1, "run_id": str(run.pk), "status": "queued", "cost_cents": 0.0, "reply": None}
    ]


def test_an_asleep_thread_records_a_message_without_a_mention_and_wakes_on_one(api):
    thread = new_thread(api)
    path = f"/api/threads/{thread['id']}/messages"
    first = post(api, path, {"text": "for the record", "mention": False})
    assert first.status_code == 202
    assert first.json() | {"message_id": 0} == {
        "message_id": 0,
        "delivered": "recorded",
        "run_id": None,
        "turn": None,
    }
    assert not Run.objects.filter(thread_id=thread["id"]).exists()
    second = post(api, path, {"text": "@agent please look"}).json()
    assert second["delivered"] == "new_turn" and second["turn"] == 1
    # The turn reads both: the message kept for it and the one that woke it.
    assert set(Message.objects.filter(thread_id=thread["id"]).values_list("run_id", flat=True)) == {
        Run.objects.get(pk=second["run_id"]).pk
    }
    lines = api.get(path).json()["items"]
    assert [(line["text"], line["mention"], line["turn"]) for line in lines] == [
        ("for the record", False, 1),
        ("@agent please look", True, 1),
    ]


@pytest.mark.parametrize(
    ("policy", "delivered", "held"),
    [("interleave", "live_turn", False), ("enqueue", "queued_turn", True)],
)
def test_a_message_while_a_turn_is_live_follows_the_policy(api, policy, delivered, held):
    thread = new_thread(api, message="first", policy=policy)
    answer = post(api, f"/api/threads/{thread['id']}/messages", {"text": "second"}).json()
    assert answer["delivered"] == delivered
    turns = {run.turn: run for run in Run.objects.filter(thread_id=thread["id"])}
    if held:
        assert answer["turn"] == 2
        # Held behind turn 1: waiting, never claimable, its Event says why.
        assert turns[2].status == "waiting"
        assert Event.objects.get(run=turns[2], seq=1).type == "run.waiting"
        assert Thread.objects.get(pk=thread["id"]).live_turn == 1
    else:
        assert answer["run_id"] == str(turns[1].pk) and set(turns) == {1}


def test_reject_names_the_live_turn_and_writes_nothing(api):
    thread = new_thread(api, message="first", policy="reject")
    live = Run.objects.get(thread_id=thread["id"])
    body = error(post(api, f"/api/threads/{thread['id']}/messages", {"text": "again"}), 409)
    assert body["run_id"] == str(live.pk) and body["turn"] == 1
    assert str(live.pk) in body["detail"]
    assert Message.objects.filter(thread_id=thread["id"]).count() == 1
    # The request's own policy overrides the thread's.
    ok = post(api, f"/api/threads/{thread['id']}/messages", {"text": "x", "policy": "interleave"})
    assert ok.json()["delivered"] == "live_turn"


def test_a_closed_thread_refuses_messages_and_its_held_turns_are_cancelled(api):
    thread = new_thread(api, message="first", policy="enqueue")
    post(api, f"/api/threads/{thread['id']}/messages", {"text": "second"})
    closed = post(api, f"/api/threads/{thread['id']}/close", {"summary": "done here"})
    assert closed.status_code == 200, closed.content
    assert (closed.json()["status"], closed.json()["summary"]) == ("closed", "done here")
    assert sorted(Run.objects.filter(thread_id=thread["id"]).values_list("turn", "status")) == [
        (1, "cancelled"),
        (2, "cancelled"),
    ]
    error(post(api, f"/api/threads/{thread['id']}/messages", {"text": "hello?"}), 409)
    error(post(api, f"/api/threads/{thread['id']}/close", {}), 409)
    last = Run.objects.get(thread_id=thread["id"], turn=2)
    assert Event.objects.filter(run=last, type="thread.closed").exists()


def test_a_turn_is_not_messaged_forked_or_retried_out_of_its_thread(api):
    thread = new_thread(api, message="first", policy="enqueue")
    post(api, f"/api/threads/{thread['id']}/messages", {"text": "second"})
    held = Run.objects.get(thread_id=thread["id"], turn=2)
    detail = error(post(api, f"/api/runs/{held.pk}/messages", {"text": "sneak"}), 409)["detail"]
    assert f"/api/threads/{thread['id']}/messages" in detail
    assert Run.objects.get(pk=held.pk).status == "waiting"  # not woken out of order
    first = Run.objects.get(thread_id=thread["id"], turn=1)
    error(post(api, f"/api/runs/{first.pk}/fork", {"from_step": 1}), 409)
    # Cancelling the live turn releases the held one, in order.
    assert post(api, f"/api/runs/{first.pk}/cancel", {}).status_code == 200
    assert Run.objects.get(pk=held.pk).status == "queued"
    assert Thread.objects.get(pk=thread["id"]).live_turn == 2
    # Turn 1 cannot be retried: turn 2 is live.
    error(post(api, f"/api/runs/{first.pk}/retry", {}), 409)


def test_the_thread_cost_ceiling_spans_turns(api):
    thread = new_thread(api, message="first", cost_ceiling_cents=10)
    run = Run.objects.get(thread_id=thread["id"])
    assert run.cost_ceiling_cents == Decimal(10)
    Run.objects.filter(pk=run.pk).update(cost_cents=Decimal(10))
    assert post(api, f"/api/runs/{run.pk}/cancel", {}).status_code == 200
    spent = api.get(f"/api/threads/{thread['id']}").json()
    assert (spent["status"], spent["cost_cents"], spent["budget_left_cents"]) == (
        "asleep",
        10.0,
        0.0,
    )
    refused = error(post(api, f"/api/threads/{thread['id']}/messages", {"text": "more"}), 409)
    assert "cost ceiling" in refused["detail"]
    assert Message.objects.filter(thread_id=thread["id"]).count() == 1


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"kind": "no_such_kind"}, "unknown kind"),
        ({"kind": "thread_echo", "policy": "shout"}, "policy"),
        ({"kind": "thread_echo", "state": [1, 2]}, "state"),
        ({"kind": "thread_echo", "message": ""}, "message"),
        ({"kind": "thread_echo", "title": "a\u0000b"}, "title"),
        ({"kind": "thread_echo", "cost_ceiling_cents": -1}, "cost_ceiling_cents"),
        ({"kind": "echo"}, "cannot play a thread's turns"),
    ],
)
def test_bad_thread_requests_are_422_and_create_nothing(api, body, where):
    detail = error(post(api, "/api/threads", body), 422)["detail"]
    assert where in detail
    assert not Thread.objects.exists()


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ({"text": ""}, "text"),
        ({"text": "x", "mention": "yes"}, "mention"),
        ({"text": "x", "policy": "later"}, "policy"),
        ({"text": "x" * 20_001}, "text"),
    ],
)
def test_bad_messages_are_422_and_write_nothing(api, body, where):
    thread = new_thread(api)
    detail = error(post(api, f"/api/threads/{thread['id']}/messages", body), 422)["detail"]
    assert where in detail
    assert not Message.objects.filter(thread_id=thread["id"]).exists()


def test_a_body_that_is_not_json_is_400(api):
    thread = new_thread(api)
    error(post(api, f"/api/threads/{thread['id']}/messages", "{not json"), 400)
    error(post(api, "/api/threads", "[1"), 400)
    assert not Message.objects.exists()


def test_another_tenants_thread_does_not_exist(api):
    other = TenantFactory()
    theirs = Client(
        headers={"Authorization": f"Bearer {create_api_key(tenant=other, name='o').secret}"}
    )
    thread = new_thread(api, message="mine")
    for response in (
        theirs.get(f"/api/threads/{thread['id']}"),
        theirs.get(f"/api/threads/{thread['id']}/messages"),
        post(theirs, f"/api/threads/{thread['id']}/messages", {"text": "hi"}),
        post(theirs, f"/api/threads/{thread['id']}/close", {}),
    ):
        error(response, 404)
    assert theirs.get("/api/threads").json()["items"] == []
    assert [t["id"] for t in api.get("/api/threads").json()["items"]] == [thread["id"]]


def test_an_idempotency_key_finds_the_thread_it_made(api):
    body = {"kind": "thread_echo", "idempotency_key": "conv-1", "message": "hello"}
    first = post(api, "/api/threads", body)
    again = post(api, "/api/threads", body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Run.objects.count() == 1
    error(post(api, "/api/threads", body | {"message": "other"}), 409)


def test_the_service_takes_the_same_rules(tenant):
    from runs.threads import create_thread

    thread, posted, _ = create_thread(tenant=tenant, kind="thread_echo", actor=PERSON)
    assert posted is None
    posted = post_thread_message(thread=thread, text="  hi  ", actor=PERSON, mention=True)
    assert posted.message.text == "hi" and posted.run is not None


def test_webhooks_tell_a_thread_asleep_and_closed_to_the_endpoints_that_want_them(api, tenant):
    from runs.models import WebhookDelivery, WebhookEndpoint

    wants = WebhookEndpoint.objects.create(
        tenant=tenant,
        url="https://hooks.example.com/threads",
        event_types=["thread.asleep", "thread.closed"],
    )
    WebhookEndpoint.objects.create(
        tenant=tenant, url="https://hooks.example.com/runs", event_types=["run.done"]
    )
    thread = new_thread(api, message="first")
    run = Run.objects.get(thread_id=thread["id"])
    post(api, f"/api/runs/{run.pk}/cancel", {})
    post(api, f"/api/threads/{thread['id']}/close", {"summary": "resolved"})
    deliveries = WebhookDelivery.objects.filter(run=run).order_by("id")
    assert [(d.endpoint_id, d.event_type) for d in deliveries] == [
        (wants.pk, "thread.asleep"),
        (wants.pk, "thread.closed"),
    ]
    asleep = Event.objects.get(run=run, type="thread.asleep")
    assert asleep.payload["thread"] == thread["id"] and asleep.payload["status"] == "cancelled"


def test_the_last_turn_is_retried_only_while_its_thread_sleeps(api):
    thread = new_thread(api, message="first")
    first = Run.objects.get(thread_id=thread["id"])
    assert post(api, f"/api/runs/{first.pk}/cancel", {}).status_code == 200
    assert Thread.objects.get(pk=thread["id"]).status == "asleep"
    retried = post(api, f"/api/runs/{first.pk}/retry", {})
    assert retried.status_code == 200, retried.content
    awake = Thread.objects.get(pk=thread["id"])
    assert (awake.status, awake.live_turn) == ("active", 1)
    assert Run.objects.get(pk=first.pk).status == "queued"
    # While it is live, a second cancel and retry are the same story; a later turn blocks a retry.
    post(api, f"/api/runs/{first.pk}/cancel", {})
    post(api, f"/api/threads/{thread['id']}/messages", {"text": "second"})
    detail = error(post(api, f"/api/runs/{first.pk}/retry", {}), 409)["detail"]
    assert "live" in detail or "last turn" in detail


def test_retention_keeps_a_threads_turns_and_their_lines(api, tenant):
    from datetime import timedelta

    from runs.engine.retention import prune_finished
    from runs.services import submit_run

    thread = new_thread(api, message="keep me")
    turn = Run.objects.get(thread_id=thread["id"])
    post(api, f"/api/runs/{turn.pk}/cancel", {})
    plain = submit_run(tenant=tenant, kind="echo", input={"text": "x", "times": 1})
    Run.objects.filter(pk=plain.pk).update(status="cancelled")
    Run.objects.update(finished_at=turn.created_at - timedelta(days=400))
    prune_finished(older_than=timedelta(days=30), batch=100)
    assert not Run.objects.filter(pk=plain.pk).exists()
    assert Run.objects.filter(pk=turn.pk).exists()
    assert Message.objects.filter(thread_id=thread["id"], text="keep me").exists()
