"""Signed webhooks end to end: a run's callback_url and a tenant's endpoints, verified by a real receiver
with the standardwebhooks library; retries keep their webhook-id; rotation; the SSRF guard at send time
and at submit; redelivery.
"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from runs import control
from runs.events import Actor
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.models import DeliveryStatus, Event, Tenant, WebhookDelivery, WebhookEndpoint
from runs.services import submit_run
from runs.webhooks import deliveries, signing
from tests.conftest import fresh
from tests.support.fake_openai import drive
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import Receiver
from workers.webhooks import DeliveryLoop

pytestmark = pytest.mark.django_db(transaction=True)

PERSON = Actor(type="user", id="7")


def secret_of(tenant: Tenant) -> str:
    return signing.current_secret(tenant.pk)


def test_a_finished_run_posts_one_signed_run_done_to_its_callback_url(
    tenant, receiver, private_allowed
):
    receiver.secrets["current"] = secret_of(tenant)
    run = submit_run(tenant=tenant, kind="echo", input={"text": "hello"}, callback_url=receiver.url)
    drive(run)
    assert DeliveryLoop(poll=0.05).run(once=True) == 1

    [got] = receiver.wait_for(1)
    assert got.verified_by == ["current"]
    body = json.loads(got.body)
    assert body["type"] == "run.done"
    assert body["data"]["run_id"] == str(run.pk)
    assert body["data"]["status"] == "done"
    assert body["data"]["result"] == fresh(run).result
    assert got.headers["webhook-id"].startswith("msg_")
    delivery = WebhookDelivery.objects.get(run=run)
    assert (delivery.status, delivery.response_code, delivery.attempts) == ("delivered", 200, 1)
    # Nothing else was due: only the terminal Event is a webhook, never a step.
    assert WebhookDelivery.objects.filter(run=run).count() == 1


def test_a_receiver_that_answers_500_then_200_gets_the_same_webhook_id_twice(
    tenant, receiver, processes, private_allowed
):
    """The delivery loop as its own process, with the default retry schedule (first retry after 5 s)."""
    receiver.secrets["current"] = secret_of(tenant)
    receiver.answer(500)
    loop = processes.manage("deliverwebhooks", "--poll", "0.2", RUNS_WEBHOOKS_ALLOW_PRIVATE="1")
    run = submit_run(
        tenant=tenant, kind="echo", input={"text": "retry me"}, callback_url=receiver.url
    )
    drive(run)

    first, second = receiver.wait_for(2, timeout=30)
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert first.body == second.body
    assert first.verified_by == second.verified_by == ["current"]
    gap = int(second.headers["webhook-timestamp"]) - int(first.headers["webhook-timestamp"])
    assert 3 <= gap <= 10  # "first retry within 10 s"
    delivery = wait_until(
        lambda: WebhookDelivery.objects.filter(run=run, status="delivered").first(),
        what="the delivery recorded as delivered",
    )
    assert (delivery.attempts, delivery.response_code) == (2, 200)
    assert loop.poll() is None, processes.output(loop)


def test_during_a_rotation_deliveries_verify_with_either_secret(tenant, receiver, private_allowed):
    receiver.secrets["old"] = secret_of(tenant)
    new = signing.rotate(tenant.pk)
    receiver.secrets["new"] = new
    run = submit_run(
        tenant=tenant, kind="echo", input={"text": "rotating"}, callback_url=receiver.url
    )
    drive(run)
    DeliveryLoop(poll=0.05).run(once=True)
    [got] = receiver.wait_for(1)
    assert sorted(got.verified_by) == ["new", "old"]
    assert len(got.headers["webhook-signature"].split(" ")) == 2

    # After the overlap only the new secret signs.
    Tenant.objects.filter(pk=tenant.pk).update(webhook_secret_previous_until="2000-01-01T00:00:00Z")
    run = submit_run(
        tenant=tenant, kind="echo", input={"text": "rotated"}, callback_url=receiver.url
    )
    drive(run)
    DeliveryLoop(poll=0.05).run(once=True)
    later = receiver.wait_for(2)[1]
    assert later.verified_by == ["new"]


def test_the_webhooksecret_command_prints_the_secret_alone_on_its_last_line(tenant, capsys):
    call_command("webhooksecret", tenant.slug)
    first = capsys.readouterr().out.strip().splitlines()[-1]
    assert first.startswith("whsec_") and first == secret_of(tenant)
    call_command("webhooksecret", tenant.slug, "--rotate")
    rotated = capsys.readouterr().out.strip().splitlines()[-1]
    assert rotated.startswith("whsec_") and rotated != first
    tenant.refresh_from_db()
    assert (tenant.webhook_secret, tenant.webhook_secret_previous) == (rotated, first)


def test_tenant_endpoints_receive_only_the_event_types_they_chose(
    tenant, receiver, private_allowed
):
    receiver.secrets["current"] = secret_of(tenant)
    WebhookEndpoint.objects.create(
        tenant=tenant, url=receiver.url + "/waiting", event_types=["run.waiting_human"]
    )
    WebhookEndpoint.objects.create(
        tenant=tenant, url=receiver.url + "/ends", event_types=["run.done", "run.cancelled"]
    )
    WebhookEndpoint.objects.create(tenant=tenant, url=receiver.url + "/off", enabled=False)
    run = submit_run(tenant=tenant, kind="approve_then_act", input={})
    drive(run, until=("waiting_human",))
    control.cancel_run(run=run, actor=PERSON)
    DeliveryLoop(poll=0.05).run(once=True)

    # run(once=True) returned once every send was made and recorded: nothing else is on its way.
    got = receiver.wait_for(2)
    assert sorted((r.path, json.loads(r.body)["type"]) for r in receiver.received) == [
        ("/hook/ends", "run.cancelled"),
        ("/hook/waiting", "run.waiting_human"),
    ]
    assert all(r.verified_by == ["current"] for r in got)
    waiting = next(json.loads(r.body) for r in got if r.path == "/hook/waiting")
    assert waiting["data"]["reason"]  # why it waits (an approval)


def test_a_delivery_that_keeps_failing_is_dead_after_the_give_up_time_and_can_be_redelivered(
    tenant, receiver, private_allowed
):
    private_allowed.RUNS_WEBHOOK_RETRY_SCHEDULE = [0.2]
    private_allowed.RUNS_WEBHOOK_GIVE_UP_SECONDS = 1.0
    receiver.default = 503
    run = submit_run(tenant=tenant, kind="echo", input={"text": "down"}, callback_url=receiver.url)
    drive(run)
    loop = DeliveryLoop(poll=0.05)

    def dead() -> bool:
        loop.run(once=True)
        return WebhookDelivery.objects.filter(run=run, status="dead").exists()

    wait_until(
        dead,
        timeout=15,
        interval=0.1,
        what=lambda: (
            f"the delivery to be dead: {list(WebhookDelivery.objects.values('status', 'attempts'))}"
        ),
    )
    dead = WebhookDelivery.objects.get(run=run)
    assert dead.attempts >= 3  # retried, then a last attempt at the give-up time
    assert dead.response_code == 503 and "503" in dead.last_error

    receiver.default = 200
    again = deliveries.redeliver(delivery=dead, actor=PERSON)
    assert again.webhook_id == dead.webhook_id and again.status == "pending"
    audit = Event.objects.filter(run=run).order_by("-seq").first()
    assert (audit.type, audit.actor_type, audit.actor_id) == ("webhook.redelivered", "user", "7")
    with pytest.raises(InvalidTransition):
        deliveries.redeliver(delivery=again, actor=PERSON)  # still live
    loop.run(once=True)
    assert fresh_delivery(again).status == "delivered"
    ids = {r.headers["webhook-id"] for r in receiver.received}
    assert ids == {dead.webhook_id}


def fresh_delivery(delivery: WebhookDelivery) -> WebhookDelivery:
    return WebhookDelivery.objects.get(pk=delivery.pk)


REFUSED = [
    ("https://127.0.0.1:9/hook", "loopback"),
    ("https://[::1]:9/hook", "loopback"),
    ("https://169.254.169.254/latest/meta-data/", "link-local"),
    ("https://10.0.0.1/hook", "private"),
    ("https://localhost:9/hook", "localhost resolves to"),
]


def test_the_guard_refuses_loopback_private_link_local_and_names_resolving_to_them(
    tenant, settings
):
    """Endpoints stored without the admin's check (an old row, a changed setting) are refused at send time."""
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    for url, _ in REFUSED:
        WebhookEndpoint.objects.create(tenant=tenant, url=url, event_types=["run.done"])
    run = submit_run(tenant=tenant, kind="echo", input={"text": "ssrf"})
    drive(run)
    DeliveryLoop(poll=0.05).run(once=True)

    recorded = {d.url: d for d in WebhookDelivery.objects.filter(run=run)}
    assert set(recorded) == {url for url, _ in REFUSED}
    for url, reason in REFUSED:
        delivery = recorded[url]
        assert delivery.status == DeliveryStatus.DEAD, (url, delivery.last_error)
        assert reason in delivery.last_error, (url, delivery.last_error)
        assert delivery.response_code is None


def test_a_redirect_is_not_followed(tenant, receiver, private_allowed):
    target = Receiver()
    try:
        receiver.answer(302, Location=target.url)
        run = submit_run(
            tenant=tenant, kind="echo", input={"text": "redirect"}, callback_url=receiver.url
        )
        drive(run)
        DeliveryLoop(poll=0.05).run(once=True)
        delivery = WebhookDelivery.objects.get(run=run)
        assert delivery.status == "pending" and delivery.response_code == 302
        assert "redirect" in delivery.last_error and "not followed" in delivery.last_error
        # The send is over (run(once=True) recorded it): had it followed the redirect, it had arrived.
        assert target.received == []
    finally:
        target.stop()


@pytest.mark.parametrize(
    "url, reason",
    [
        ("ftp://example.com/hook", "https"),
        ("http://example.com/hook", "https"),
        ("https://127.0.0.1/hook", "loopback"),
        ("https://[::1]/hook", "loopback"),
        ("https://169.254.169.254/", "link-local"),
        ("https://10.0.0.1/", "private"),
        ("https://localhost/hook", "localhost"),
    ],
)
def test_a_callback_url_that_can_never_be_delivered_is_refused_at_submit(
    tenant, settings, url, reason
):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    with pytest.raises(InvalidRunInput) as refused:
        submit_run(tenant=tenant, kind="echo", input={"text": "x"}, callback_url=url)
    assert reason in str(refused.value)


def test_the_api_answers_422_with_the_reason_for_a_forbidden_callback_url(api, settings):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    response = api.post(
        "/api/runs",
        {"kind": "echo", "input": {"text": "x"}, "callback_url": "https://169.254.169.254/latest"},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert "link-local" in response.json()["detail"]
    accepted = api.post(
        "/api/runs",
        {"kind": "echo", "input": {"text": "x"}, "callback_url": "https://hooks.example.com/runs"},
        content_type="application/json",
    )
    assert accepted.status_code == 202


def test_operators_register_endpoints_and_redeliver_in_the_admin(admin_client, tenant, settings):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    add = "/admin/runs/webhookendpoint/add/"
    refused = admin_client.post(
        add,
        {
            "tenant": tenant.pk,
            "url": "https://169.254.169.254/x",
            "event_types": ["run.done"],
            "enabled": "on",
        },
    )
    assert refused.status_code == 200 and "can never be delivered to" in refused.content.decode()
    assert not WebhookEndpoint.objects.exists()
    created = admin_client.post(
        add,
        {
            "tenant": tenant.pk,
            "url": "https://hooks.example.com/runs",
            "event_types": ["run.done", "run.failed"],
            "enabled": "on",
        },
    )
    assert created.status_code == 302
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.event_types == ["run.done", "run.failed"]

    # A dead delivery of a finished run, redelivered from the list's action with the same webhook-id.
    run = submit_run(tenant=tenant, kind="echo", input={"text": "x"})
    drive(run)
    dead = WebhookDelivery.objects.get(run=run)  # the endpoint's
    WebhookDelivery.objects.filter(pk=dead.pk).update(
        status="dead", last_error="the receiver answered 500"
    )
    page = admin_client.get("/admin/runs/webhookdelivery/")
    assert page.status_code == 200 and "the receiver answered 500" in page.content.decode()
    admin_client.post(
        "/admin/runs/webhookdelivery/", {"action": "redeliver", "_selected_action": [dead.pk]}
    )
    again = WebhookDelivery.objects.exclude(pk=dead.pk).get(run=run)
    assert (again.status, again.webhook_id, again.url) == (
        "pending",
        dead.webhook_id,
        "https://hooks.example.com/runs",
    )
