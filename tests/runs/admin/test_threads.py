"""Threads in the operations console: read-only pages of the conversation, and closing threads."""

from __future__ import annotations

import pytest
from django.urls import reverse

from runs.events import Actor
from runs.models import Event, Message, Run, Thread
from runs.threads import create_thread, post_thread_message
from tests.support.admin_helpers import messages_of, staff_user

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:runs_thread_changelist")
PERSON = Actor(type="user", id="9")


def conversation(tenant) -> Thread:
    thread, _, _ = create_thread(
        tenant=tenant,
        kind="thread_echo",
        actor=PERSON,
        title="Refund for order 1042",
        policy="enqueue",
    )
    post_thread_message(thread=thread, text="Where is my refund?", actor=PERSON)
    post_thread_message(thread=thread, text="Hello??", actor=PERSON)
    return Thread.objects.get(pk=thread.pk)


def test_an_operator_reads_a_thread_its_turns_and_its_conversation(operator_client, tenant):
    thread = conversation(tenant)
    listing = operator_client.get(CHANGELIST)
    assert listing.status_code == 200
    assert "Refund for order 1042" in listing.content.decode()
    page = operator_client.get(reverse("admin:runs_thread_change", args=[thread.pk]))
    body = page.content.decode()
    assert page.status_code == 200
    assert "Where is my refund?" in body and "Hello??" in body
    for run in Run.objects.filter(thread=thread):
        assert reverse("admin:runs_run_change", args=[run.pk]) in body
    # Nothing on it is editable here: the turns and people change a thread, through the services.
    assert 'name="_save"' not in body


def test_closing_threads_cancels_their_turns_and_names_the_operator(
    operator_client, operator, tenant
):
    thread = conversation(tenant)
    response = operator_client.post(
        CHANGELIST, {"action": "close_threads", "_selected_action": [str(thread.pk)]}, follow=True
    )
    assert "Closed 1 thread." in messages_of(response)
    thread.refresh_from_db()
    assert (thread.status, thread.summary) == ("closed", "closed by an operator")
    assert set(Run.objects.filter(thread=thread).values_list("status", flat=True)) == {"cancelled"}
    closed = Event.objects.get(type="thread.closed", run__thread=thread)
    assert (closed.actor_type, closed.actor_id) == ("user", str(operator.pk))
    assert Message.objects.filter(thread=thread).count() == 2


def test_closing_needs_the_permission_to_cancel(client, tenant):
    viewer = staff_user("view_run", "view_step")
    client.force_login(viewer)
    thread = conversation(tenant)
    response = client.post(
        CHANGELIST, {"action": "close_threads", "_selected_action": [str(thread.pk)]}, follow=True
    )
    assert any("permission" in m for m in messages_of(response))
    assert Thread.objects.get(pk=thread.pk).status == "active"
