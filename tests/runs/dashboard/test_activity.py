"""People have names, and a run page has an activity log: ``runs.actors`` and ``runs.dashboard.activity``.

Runs get their history through the real services (the API, ``runs.control``)
and a real worker in burst mode (tests/support/control_helpers.py), and the log is
read back from their Events.
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from runs import control
from runs.actors import describe_actor, describe_actors, message_author, parse_actor
from runs.dashboard.activity import activity, last_actor, who_cancelled
from runs.events import Actor
from runs.keys import create_api_key
from runs.models import Event, Message, Run
from tests.conftest import fresh
from tests.support import run_states
from tests.support.browser import assert_accessible, browser_page, screenshots
from tests.support.control_helpers import Person, act, approval_run, burst_worker, chat_run
from tests.support.factories import TenantFactory, UserFactory

XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'


def person(**names) -> tuple[object, Actor]:
    user = UserFactory(**names)
    return user, Actor(type="user", id=str(user.pk))


def sentences(run: Run, **kwargs) -> list[str]:
    return [entry.sentence for entry in activity(run, **kwargs).entries]


def submitted_through_the_api(bot: Person, kind: str, input: dict) -> Run:
    response = bot.client.post(
        "/api/runs",
        data=json.dumps({"kind": kind, "input": input}),
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    return Run.objects.get(pk=response.json()["id"])


# --- names -------------------------------------------------------------------------


@pytest.mark.django_db
def test_actors_are_named_in_one_query_per_kind_of_actor(tenant, django_assert_num_queries):
    ana = UserFactory(username="ana", first_name="Ana", last_name="Lopez")
    bo = UserFactory(username="bo")
    ours = create_api_key(tenant=tenant, name="ci-bot").api_key
    theirs = create_api_key(tenant=TenantFactory(), name="their-secret-integration").api_key
    gone_user = UserFactory()
    gone_user_id = str(gone_user.pk)
    gone_user.delete()
    gone_key = create_api_key(tenant=tenant, name="old-key").api_key
    gone_key_id = str(gone_key.pk)
    gone_key.delete()
    pairs = [
        ("user", str(ana.pk)),
        ("user", str(bo.pk)),
        ("user", gone_user_id),
        ("user", "not-a-number"),
        ("api_key", str(ours.pk)),
        ("api_key", str(theirs.pk)),
        ("api_key", gone_key_id),
        ("worker", str(uuid.uuid4())),
        ("system", "reaper"),
        ("system", "timer"),
        ("system", ""),
        ("system", f"parent:{uuid.uuid4()}"),
        ("martian", "1"),
    ]

    with django_assert_num_queries(2):
        names = describe_actors(pairs, tenant_id=tenant.pk)

    assert [names[pair] for pair in pairs] == [
        "Ana Lopez",
        "bo",
        "a deleted user",
        "a deleted user",
        "API key ‘ci-bot’",
        "an API key",
        "a deleted API key",
        "the worker",
        "the reaper",
        "the timer",
        "the system",
        "its parent run",
        "someone",
    ]
    # The other tenant's key is named within its own tenant only.
    assert (
        describe_actor("api_key", str(theirs.pk), tenant_id=theirs.tenant_id)
        == "API key ‘their-secret-integration’"
    )
    with django_assert_num_queries(0):
        assert describe_actors([("worker", "w"), ("system", "reaper")], tenant_id=tenant.pk) == {
            ("worker", "w"): "the worker",
            ("system", "reaper"): "the reaper",
        }


@pytest.mark.django_db
def test_an_approvals_by_and_a_messages_author_are_named():
    tenant = TenantFactory()
    ana, as_ana = person(first_name="Ana", last_name="Lopez")
    run = run_states.waiting_for_a_message(tenant)
    control.post_message(run=run, actor=as_ana, text="hello")
    bot = create_api_key(tenant=tenant, name="ci-bot").api_key
    control.post_message(
        run=run, actor=Actor(type="api_key", id=str(bot.pk)), text="and hello from CI"
    )

    messages = list(Message.objects.filter(run=run).order_by("id"))
    names = describe_actors(
        ((m.author_type, m.author_id) for m in messages), tenant_id=run.tenant_id
    )
    assert [message_author(m, names) for m in messages] == ["Ana Lopez", "API key ‘ci-bot’"]
    # How an approval step's output and ctx.messages() spell an actor ("user:7").
    assert describe_actor(*parse_actor(f"user:{ana.pk}"), tenant_id=tenant.pk) == "Ana Lopez"


# --- the activity log, through the real services --------------------------------------


# A worker in this process claims runs on connections of its own.
flow = pytest.mark.django_db(transaction=True)


@flow
def test_submitted_by_an_api_key_approved_with_a_comment_by_a_user(tenant, tmp_path):
    bot = Person(tenant, "ci-bot")
    ana, as_ana = person(username="ana", first_name="Ana", last_name="Lopez")
    run = submitted_through_the_api(bot, "approve_then_act", {"log": str(tmp_path / "exec.log")})
    burst_worker()
    assert fresh(run).status == "waiting_human"

    control.approve_run(run=run, actor=as_ana, comment="Looks right: the deal is won.")
    burst_worker()
    assert fresh(run).status == "done"

    log = activity(fresh(run))
    assert [entry.sentence for entry in log.entries] == [
        "API key ‘ci-bot’ submitted it.",
        "Started.",
        "Waiting for a person to approve step 2 “update_crm”.",
        "Ana Lopez approved step 2 “update_crm”.",
        "Finished.",
    ]
    approved = log.entries[3]
    assert (approved.actor, approved.who, approved.comment, approved.tone) == (
        "Ana Lopez",
        "Ana Lopez",
        "Looks right: the deal is won.",
        "person",
    )
    assert log.earlier == 0
    assert [entry.at for entry in log.entries] == sorted(entry.at for entry in log.entries)
    # Every step is in the step timeline, not here; every Event of the log is one of the run's.
    assert Event.objects.filter(run=run, type="step.done").count() >= 2
    assert {entry.seq for entry in log.entries} <= set(
        Event.objects.filter(run=run).values_list("seq", flat=True)
    )


@flow
def test_rejected_then_cancelled_through_the_api_then_retried_from_a_step(tenant, tmp_path):
    ops = Person(tenant, "ops")
    bo, as_bo = person(username="bo")
    run = approval_run(tenant, str(tmp_path / "exec.log"))
    control.reject_run(
        run=run, actor=Actor(type="api_key", id=str(ops.key.pk)), comment="Not this quarter."
    )
    burst_worker()
    assert fresh(run).status == "done"

    second = approval_run(tenant, str(tmp_path / "exec.log"))
    assert act(ops.client, second, "cancel").status_code == 200
    assert who_cancelled(fresh(second)) == "API key ‘ops’"
    control.retry_run(run=fresh(second), actor=as_bo, from_step=2)
    burst_worker()

    assert sentences(fresh(run)) == [
        "The system submitted it.",
        "Started.",
        "Waiting for a person to approve step 2 “update_crm”.",
        "API key ‘ops’ rejected step 2 “update_crm”.",
        "Finished.",
    ]
    assert activity(fresh(run)).entries[3].comment == "Not this quarter."
    assert sentences(fresh(second)) == [
        "The system submitted it.",
        "Started.",
        "Waiting for a person to approve step 2 “update_crm”.",
        "API key ‘ops’ cancelled it.",
        "bo retried it from step 2.",
        "Waiting for a person to approve step 2 “update_crm”.",
    ]


@flow
def test_a_message_then_a_cancel_honoured_by_the_worker_names_who_asked(tenant):
    from runs.engine.exit import Exit, leave

    ana, as_ana = person(first_name="Ana", last_name="Lopez")
    run = chat_run(tenant)
    control.post_message(run=run, actor=as_ana, text=f"hello {XSS}")
    run = run_states.force_status(fresh(run), "running", claimed_at=timezone.now())  # claimed again
    outcome = control.cancel_run(run=run, actor=as_ana)
    assert outcome.later
    # The worker honours the request at its step boundary: the engine's own exit statement.
    leave(Exit.release(reason="released").of_run(run.pk, 1, actor_id=str(uuid.uuid4())))
    assert fresh(run).status == "cancelled"

    log = activity(fresh(run))
    assert [entry.sentence for entry in log.entries] == [
        "The system submitted it.",
        "Started.",
        "Waiting for a message.",
        "Ana Lopez sent a message.",
        "Ana Lopez asked to cancel it at the end of its current step.",
        "Cancelled at the end of a step.",
    ]
    assert log.entries[3].comment == f"hello {XSS}"
    assert log.entries[-1].actor == "the worker"
    assert who_cancelled(fresh(run)) == "Ana Lopez"
    assert last_actor(fresh(run), "message.received") == "Ana Lopez"
    assert last_actor(fresh(run), "run.approved") is None

    # Untrusted text is escaped in the page.
    html = render_to_string("runs/_activity.html", {"activity": log})
    assert "<script>" not in html and "&lt;script&gt;window.__xss = 1&lt;/script&gt;" in html
    assert html.count('data-testid="activity-entry"') == 6
    assert '<time datetime="' in html


@flow
def test_pause_resume_and_a_cancel_by_its_parent(tenant):
    ana, as_ana = person(username="ana")
    run = run_states.queued(tenant)
    control.pause_run(run=run, actor=as_ana)
    control.resume_run(run=fresh(run), actor=as_ana)
    control.cancel_runs([run.pk], actor=Actor(type="system", id=f"parent:{uuid.uuid4()}"))

    assert sentences(fresh(run)) == [
        "The system submitted it.",
        "ana paused it.",
        "ana resumed it.",
        "Its parent run cancelled it.",
    ]
    assert who_cancelled(fresh(run)) == "Its parent run"
    assert last_actor(fresh(run), "run.cancelled", people_only=True) is None
    # Nobody on record (an old run, or one cancelled before Events named people): still a sentence.
    Event.objects.filter(run=run, type="run.cancelled").delete()
    assert who_cancelled(run) == "A person"


@flow
def test_a_fork_links_both_runs(tenant, tmp_path):
    ana, as_ana = person(first_name="Ana", last_name="Lopez")
    origin = approval_run(tenant, str(tmp_path / "exec.log"))
    fork = control.fork_run(run=fresh(origin), actor=as_ana, from_step=2)

    forked = activity(fresh(origin)).entries[-1]
    assert forked.sentence == f"Ana Lopez forked it from step 2 into run {str(fork.pk)[:8]}."
    assert forked.run_link == str(fork.pk)
    born = activity(fresh(fork)).entries[0]
    assert born.sentence == f"Ana Lopez forked it from step 2 of run {str(origin.pk)[:8]}."
    html = render_to_string("runs/_activity.html", {"activity": activity(fresh(origin))})
    assert f'href="/runs/{fork.pk}/"' in html


@pytest.mark.django_db
def test_the_log_is_bounded_and_says_how_much_it_leaves_out(tenant, django_assert_num_queries):
    ana, as_ana = person(first_name="Ana", last_name="Lopez")
    bot = create_api_key(tenant=tenant, name="ci-bot").api_key
    run = run_states.waiting_for_a_message(tenant)
    for n in range(6):
        control.post_message(run=run, actor=as_ana, text=f"note {n}")
        control.post_message(run=run, actor=Actor(type="api_key", id=str(bot.pk)), text=f"bot {n}")

    # The Events, the count of earlier ones, the users, the keys: four queries whatever the length.
    with django_assert_num_queries(4):
        log = activity(run, limit=5)
    assert len(log.entries) == 5
    assert log.earlier == 8  # submitted + 12 messages - 5 shown
    assert [entry.comment for entry in log.entries] == [
        "bot 3",
        "note 4",
        "bot 4",
        "note 5",
        "bot 5",
    ]
    with django_assert_num_queries(3):  # all of it fits: no count
        assert len(activity(run).entries) == 13
    html = render_to_string("runs/_activity.html", {"activity": log})
    assert "8 earlier entries not shown." in html


@pytest.mark.django_db
def test_another_tenants_key_is_never_named_in_the_log(tenant):
    run = run_states.waiting_for_a_message(tenant)
    theirs = create_api_key(tenant=TenantFactory(), name="their-secret-integration").api_key
    control.post_message(run=run, actor=Actor(type="api_key", id=str(theirs.pk)), text="hi")

    assert sentences(run)[-1] == "An API key sent a message."
    html = render_to_string("runs/_activity.html", {"activity": activity(run)})
    assert "their-secret-integration" not in html


@pytest.mark.django_db(transaction=True)
def test_the_log_reads_at_a_phones_width(live_server, chromium, tenant, tmp_path):
    """The include with the dashboard's styles and its own, at 1280 and 390 px (before it is on the run page)."""
    bot = Person(tenant, "ci-bot")
    ana, as_ana = person(first_name="Ana", last_name="Lopez")
    run = submitted_through_the_api(bot, "approve_then_act", {"log": str(tmp_path / "exec.log")})
    burst_worker()
    control.approve_run(
        run=run,
        actor=as_ana,
        comment="Looks right, but check the amount with finance before "
        "it goes out: " + "a-very-long-unbroken-word-" * 8 + XSS,
    )
    burst_worker()
    control.fork_run(run=fresh(run), actor=as_ana, from_step=2)
    html = render_to_string("runs/_activity.html", {"activity": activity(fresh(run))})
    page_html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><title>Activity</title>'
        f'<link rel="stylesheet" href="{live_server.url}/static/css/app.css">'
        f'<link rel="stylesheet" href="{live_server.url}/static/css/activity.css">'
        f"</head><body><main>{html}</main></body></html>"
    )

    with browser_page(chromium) as page:
        page.goto(live_server.url + "/accounts/login/")  # same origin as the stylesheets
        page.set_content(page_html, wait_until="load")
        entries = page.get_by_test_id("activity-entry")
        assert entries.count() == 6
        assert page.get_by_test_id("activity-comment").inner_text().endswith(XSS)
        assert page.evaluate("window.__xss === undefined")
        assert page.locator("time").first.get_attribute("datetime")
        screenshots(page, "run-activity")
        assert_accessible(page)
