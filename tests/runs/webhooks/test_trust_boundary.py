"""Webhooks across the trust boundary between tenants, and between a tenant and the network (issue 25).

- One tenant's receiver that accepts and never answers does not hold up
  another tenant's deliveries; it is paused after repeated silence, shown
  in the admin, and resumed there (a real ``deliverwebhooks`` process, a
  real tarpit on loopback).
- Every malformed callback URL is a 422 with a readable detail, never a 500.
- Webhooks go to public hosts only on the allowed ports (443 unless an
  operator says otherwise), refused at submit and at send time; tenants see
  what kind of failure an attempt met, operators the whole error.
"""

from __future__ import annotations

import socket
import time

import pytest
from django.db.models.functions import Now
from django.test import Client
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from runs import models
from runs.keys import create_api_key
from runs.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from runs.services import submit_run
from runs.webhooks import targets
from tests.support.factories import MembershipFactory, TenantFactory
from tests.support.fake_openai import drive
from tests.support.waiting import wait_until
from workers.webhooks import DeliveryLoop

pytestmark = pytest.mark.django_db(transaction=True)


def finished_runs(tenant, count: int, **fields) -> list:
    runs = [
        submit_run(tenant=tenant, kind="echo", input={"text": f"run {n}"}, **fields)
        for n in range(count)
    ]
    drive(*runs)
    return runs


# 4. One tenant holds up every tenant's webhooks


def test_a_tenant_whose_receiver_never_answers_does_not_hold_up_another_tenants_delivery(
    receiver, tarpit, processes, private_allowed, admin_client
):
    hanging, other = TenantFactory(), TenantFactory()
    endpoint = WebhookEndpoint.objects.create(
        tenant=hanging, url=tarpit.url, event_types=["run.done"]
    )
    finished_runs(hanging, 24)
    [wanted] = finished_runs(other, 1, callback_url=receiver.url)
    # The hanging tenant's 24 deliveries are older: a claim by due time alone would take them first.
    assert WebhookDelivery.objects.filter(tenant=hanging, status="pending").count() == 24
    at_arrival: list[tuple[int, int]] = []
    receiver.on_request = lambda: at_arrival.append(tarpit.counts())

    processes.manage(
        "deliverwebhooks",
        "--poll",
        "0.1",
        RUNS_WEBHOOKS_ALLOW_PRIVATE="1",
        RUNS_WEBHOOK_TIMEOUT_SECONDS="10",
        RUNS_WEBHOOK_PAUSE_AFTER="5",
    )

    [got] = receiver.wait_for(1, timeout=60)
    assert got.path == "/hook"
    accepted, hung_up = at_arrival[0]
    # When the other tenant's delivery arrived, none of the hanging tenant's attempts had given up
    # yet: it did not wait behind them. (Whether the tarpit had accepted one yet is a race.)
    assert hung_up == 0, (accepted, hung_up)
    # Nor did the hanging tenant get every slot (8): some are kept for the others.
    assert accepted < 8
    wait_until(
        lambda: WebhookDelivery.objects.filter(run=wanted, status="delivered").exists(),
        what="the other tenant's delivery recorded as delivered",
    )

    # Silence after silence: the hanging tenant's receiver is paused, its deliveries wait.
    paused = wait_until(
        lambda: models.WebhookReceiver.objects.filter(
            tenant=hanging, paused_at__isnull=False
        ).first(),
        timeout=90,
        what="the tarpit's receiver paused",
    )
    assert paused.receiver == tarpit.url.removesuffix("/hook")
    assert "attempts in a row got no answer" in paused.paused_reason
    assert "timed out" in paused.paused_reason
    wait_until(
        lambda: not WebhookDelivery.objects.filter(tenant=hanging, status="sending").exists(),
        timeout=60,
        what="the attempts under way at the pause recorded",
    )
    statuses = set(WebhookDelivery.objects.filter(tenant=hanging).values_list("status", flat=True))
    assert statuses == {"pending"}  # nothing lost, nothing given up on
    attempts_at_pause = tarpit.counts()[0]
    time.sleep(1.0)  # ten polls of the loop that try nothing: the behaviour under test, not a wait
    assert tarpit.counts()[0] == attempts_at_pause  # a paused receiver is not tried

    # The admin shows the endpoint paused, with why and since when, and resumes it.
    endpoints = admin_client.get("/admin/runs/webhookendpoint/").content.decode()
    assert "paused since" in endpoints and "attempts in a row got no answer" in endpoints
    listed = admin_client.get("/admin/runs/webhookreceiver/?paused=yes").content.decode()
    assert paused.receiver in listed and "timed out" in listed
    answer = admin_client.post(
        "/admin/runs/webhookendpoint/",
        {"action": "resume", "_selected_action": [endpoint.pk]},
        follow=True,
    )
    assert "1 receiver(s) resumed; 24 waiting delivery(ies) are due now." in answer.content.decode()
    resumed = models.WebhookReceiver.objects.get(pk=paused.pk)
    assert resumed.paused_at is None and resumed.resumed_by.startswith("user:")
    # Due again: the loop tries the tarpit once more.
    wait_until(lambda: tarpit.counts()[0] > attempts_at_pause, what="an attempt after the resume")


def test_a_callback_url_that_keeps_failing_pauses_that_receiver_for_its_tenant_only(
    private_allowed, admin_client
):
    """A run's callback_url has no endpoint row: its tenant's receiver (scheme, host, port) is what pauses."""
    private_allowed.RUNS_WEBHOOK_PAUSE_AFTER = 2
    private_allowed.RUNS_WEBHOOK_RETRY_SCHEDULE = [0.05]
    with socket.create_server(("127.0.0.1", 0)) as sock:
        port = sock.getsockname()[1]
    closed = f"http://127.0.0.1:{port}"  # nothing listens: every attempt is refused
    mine, theirs = TenantFactory(), TenantFactory()
    [my_run, _] = finished_runs(mine, 2, callback_url=f"{closed}/a")
    [their_run] = finished_runs(theirs, 1, callback_url=f"{closed}/b")
    loop = DeliveryLoop(poll=0.05)
    loop.run(once=True)

    [health] = models.WebhookReceiver.objects.filter(tenant=mine)
    assert (health.receiver, health.silent_attempts) == (closed, 2)
    assert health.paused_at is not None and "connection refused" in health.paused_reason
    # The other tenant's single failure to the same host pauses nothing of its own.
    assert models.WebhookReceiver.objects.get(tenant=theirs).paused_at is None
    wait_until(  # the retry schedule's 0.05 s, by the database's clock
        lambda: WebhookDelivery.objects.filter(
            run=their_run, status="pending", next_attempt_at__lte=Now()
        ).exists(),
        timeout=10,
        what="the other tenant's failed delivery to be due again",
    )
    before = {d.pk: d.attempts for d in WebhookDelivery.objects.filter(tenant=mine)}
    loop.run(once=True)
    assert {d.pk: d.attempts for d in WebhookDelivery.objects.filter(tenant=mine)} == before
    assert WebhookDelivery.objects.get(run=their_run).attempts == 2  # retried as usual
    member = MembershipFactory(tenant=mine, role="viewer")
    tenant_view = Client()
    tenant_view.force_login(member.user)
    page = tenant_view.get(f"/runs/{my_run.id}/").content.decode()
    assert "could not connect" in page and "paused: the receiver kept not answering" in page

    admin_client.post(
        "/admin/runs/webhookreceiver/", {"action": "resume", "_selected_action": [health.pk]}
    )
    assert models.WebhookReceiver.objects.get(pk=health.pk).paused_at is None
    loop.run(once=True)
    assert all(WebhookDelivery.objects.get(pk=pk).attempts > n for pk, n in before.items())


# 6. A malformed callback_url is a 422, never a 500

HOSTILE_URLS = [
    "https://[v1.a:b]/",
    "https://[v7.x]/",
    "https://[::1/",
    "https://::1]/",
    "https://[zz]/",
    "https://[1.2.3.4]/",
    "https://[::1]x/",
    "https://[::1]:x/",
    "https://[fe80::1%25eth0]/",
    "https://[fe80::1%eth0]/",
    "https://[::ffff:999.1.1.1]/",
    "https://[:::1]/",
    "https://[1::2::3]/",
    "https://[]/",
    "https://example.com:0/",
    "https://example.com:65536/",
    "https://example.com:99999999999/",
    "https://example.com:-1/",
    "https://example.com:+443/",
    "https://example.com: 443/",
    "https://example.com:/",
    "https://example.com:44 3/",
    "https://example.com:443:443/",
    "https://example.com:٤٤٣/",
    "https://user@example.com/",
    "https://user:pw@example.com/",
    "https://@example.com/",
    "https://example.com\\@evil.com/",
    "https://exa\x00mple.com/",
    "https://example.com/\x00",
    "https://exa mple.com/",
    " https://example.com/",
    "https://example.com/\n",
    "https://example.com/\u202e",
    "https://example.com/\u200b",
    "https://exa%00mple.com/",
    "https://%65xample.com/",
    "https:///hook",
    "https://",
    "https:example.com",
    "//example.com/",
    "example.com",
    "https://a..b/",
    "https://.example.com/",
    "https://" + "a" * 64 + ".com/",
    "https://" + ".".join(["a" * 60] * 5) + "/",
    "https://example.com/" + "a" * 2100,
    "https://ex[ample.com/",
    "https://exam]ple.com/",
    "https://exa\u00admple.com/",
    "https://example.com\uff0fpath",
    "javascript:alert(1)",
    "file:///etc/passwd",
    "gopher://example.com/",
    "https://0x7f.1/",
    "https://2130706433/",
    "https://[::1]/",
]


@pytest.mark.parametrize("allow_private", [False, True], ids=["public-only", "private-allowed"])
def test_every_malformed_callback_url_is_a_422_with_a_readable_detail(api, settings, allow_private):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = allow_private
    for url in HOSTILE_URLS:
        if allow_private and url in ("https://0x7f.1/", "https://2130706433/", "https://[::1]/"):
            continue  # loopback, which this setting allows
        response = api.post(
            "/api/runs",
            {"kind": "echo", "input": {"text": "x"}, "callback_url": url},
            content_type="application/json",
        )
        assert response.status_code == 422, (url, response.status_code, response.content[:300])
        detail = response.json()["detail"]
        assert isinstance(detail, str) and 10 < len(detail) < 600, (url, detail)
        assert "Traceback" not in detail and "\x00" not in detail, (url, detail)


@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=80).map(lambda s: "https://" + s),
        st.text(alphabet="[]:%@.0123456789abcdefv/\\?#+- ", max_size=40).map(
            lambda s: "https://" + s
        ),
        st.from_regex(r"https://\[[0-9a-fv:.%]{0,30}\](:[0-9+-]{0,8})?/", fullmatch=True),
        st.from_regex(
            r"https://\[v[0-9a-f]{1,3}\.[a-z0-9:._~-]{1,12}\](:[0-9]{1,6})?/", fullmatch=True
        ),  # IPvFuture
    )
)
@pytest.mark.django_db(transaction=False)
def test_the_url_check_only_ever_refuses_with_a_sentence(url):
    for private in (False, True):
        try:
            targets.check_url(url, allow_private=private)
        except targets.Refused as exc:
            assert str(exc)


def test_the_admin_refuses_a_malformed_endpoint_url_with_a_form_error(admin_client):
    response = admin_client.post(
        "/admin/runs/webhookendpoint/add/",
        {
            "tenant": TenantFactory().pk,
            "url": "https://[v1.a:b]/",
            "event_types": ["run.done"],
            "enabled": "on",
        },
    )
    assert response.status_code == 200
    assert not WebhookEndpoint.objects.exists()


# 9. Webhooks must not probe ports of public hosts


@pytest.mark.parametrize("allow_private", [False, True], ids=["public-only", "private-allowed"])
@pytest.mark.parametrize(
    "url",
    [
        "https://93.184.216.34:5432/",
        "https://hooks.example.com:22/x",
        "https://[2606:4700::1111]:6379/",
        "https://hooks.example.com:8443/",
    ],
)
def test_a_public_host_on_another_port_than_443_is_refused_at_submit(
    api, settings, url, allow_private
):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = allow_private
    if allow_private and "hooks.example.com" in url:
        pytest.skip(
            "with private addresses allowed a name's port is judged at send time, once resolved"
        )
    response = api.post(
        "/api/runs",
        {"kind": "echo", "input": {"text": "x"}, "callback_url": url},
        content_type="application/json",
    )
    assert response.status_code == 422
    assert "is not allowed for webhooks (allowed: 443)" in response.json()["detail"]


def test_operators_choose_the_ports(api, settings):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    settings.RUNS_WEBHOOK_PORTS = [443, 8443]
    accepted = api.post(
        "/api/runs",
        {
            "kind": "echo",
            "input": {"text": "x"},
            "callback_url": "https://hooks.example.com:8443/runs",
        },
        content_type="application/json",
    )
    assert accepted.status_code == 202
    refused = api.post(
        "/api/runs",
        {
            "kind": "echo",
            "input": {"text": "x"},
            "callback_url": "https://hooks.example.com:9443/runs",
        },
        content_type="application/json",
    )
    assert refused.status_code == 422 and "allowed: 443, 8443" in refused.json()["detail"]


def test_the_admin_refuses_an_endpoint_on_another_port(admin_client, settings):
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = False
    response = admin_client.post(
        "/admin/runs/webhookendpoint/add/",
        {
            "tenant": TenantFactory().pk,
            "url": "https://93.184.216.34:5432/",
            "event_types": ["run.done"],
            "enabled": "on",
        },
    )
    assert response.status_code == 200 and "port 5432 is not allowed" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_stored_url_on_another_port_is_refused_at_send_time_without_connecting(
    tenant, private_allowed
):
    """An endpoint stored before the rule (or by hand) is dead at its first attempt, even with private allowed."""
    WebhookEndpoint.objects.create(
        tenant=tenant, url="https://93.184.216.34:5432/", event_types=["run.done"]
    )
    [run] = finished_runs(tenant, 1)
    DeliveryLoop(poll=0.05).run(once=True)
    delivery = WebhookDelivery.objects.get(run=run)
    assert delivery.status == DeliveryStatus.DEAD and delivery.response_code is None
    assert delivery.last_error == "port 5432 is not allowed for webhooks (allowed: 443)"
    assert delivery.failure == "refused"


def test_tenants_see_what_kind_of_failure_operators_see_the_whole_error(
    tarpit, private_allowed, admin_client
):
    private_allowed.RUNS_WEBHOOK_TIMEOUT_SECONDS = 0.5
    with socket.create_server(("127.0.0.1", 0)) as sock:
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    member = MembershipFactory(role="operator")
    [silent] = finished_runs(member.tenant, 1, callback_url=tarpit.url)
    [refused] = finished_runs(member.tenant, 1, callback_url=closed)
    DeliveryLoop(poll=0.05).run(once=True)
    tenant_view = Client()
    tenant_view.force_login(member.user)

    page = tenant_view.get(f"/runs/{silent.id}/").content.decode()
    assert "the receiver did not answer" in page
    assert "timed out" not in page and "waiting for the answer" not in page
    page = tenant_view.get(f"/runs/{refused.id}/").content.decode()
    assert "could not connect" in page and "connection refused" not in page
    # The API has no deliveries, and a run's own fields carry none of it.
    key = create_api_key(tenant=member.tenant, name="t").secret
    answer = Client(headers={"Authorization": f"Bearer {key}"}).get(f"/api/runs/{refused.id}")
    assert answer.status_code == 200 and "connection refused" not in answer.content.decode()

    for run, whole in (
        (silent, "timed out after 0.5 s (waiting for the answer)"),
        (refused, "connection refused"),
    ):
        delivery = WebhookDelivery.objects.get(run=run)
        assert delivery.last_error == whole
        assert (
            whole
            in admin_client.get(
                f"/admin/runs/webhookdelivery/{delivery.pk}/change/"
            ).content.decode()
        )
