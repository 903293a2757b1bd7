"""An event stream dies with its credentials (issue 25, finding 10): a stream token whose key is revoked opens
nothing, and an open stream (with a key, a token or a session) ends soon after its key is revoked, its user
leaves the tenant or logs out. Served by a real `manage.py serve`, read by a real HTTP client.
"""

from __future__ import annotations

import time

import httpx
import pytest
from django.contrib.sessions.models import Session
from django.utils import timezone

from runs.keys import create_api_key
from runs.models import ApiKey, Membership
from runs.services import submit_run
from tests.support.factories import MembershipFactory
from tests.support.web import Web, bearer, first_answer, session_of

pytestmark = pytest.mark.django_db(transaction=True)

# The hub checks its streams' credentials this often (RUNS_STREAM_BACKSTOP_SECONDS); a test waits far longer.
CHECK_SECONDS = 0.5
ENDS_WITHIN_SECONDS = 30


@pytest.fixture
def web_rechecking(processes):
    """A `manage.py serve` process whose streams check their credentials every CHECK_SECONDS."""
    return Web(
        processes,
        RUNS_STREAM_BACKSTOP_SECONDS=str(CHECK_SECONDS),
        RUNS_STREAM_KEEPALIVE_SECONDS="0.5",
    ).start()


@pytest.fixture
def run(tenant):
    return submit_run(
        tenant=tenant, kind="echo", input={"text": "no worker: it stays queued"}
    )  # never ends


def revoke(secret: str) -> None:
    ApiKey.objects.filter(prefix=secret.split("_")[1]).update(revoked_at=timezone.now())


def read_until_closed(response: httpx.Response, *, then=None) -> list[str]:
    """The stream's lines until the server ends it; ``then()`` runs once the stream is open."""
    lines, deadline = [], time.monotonic() + ENDS_WITHIN_SECONDS
    for (
        line
    ) in response.iter_lines():  # keep-alive comments every 0.5 s: the deadline is checked often
        lines.append(line)
        if then is not None and line.startswith(": run "):
            then()
            then = None
        if time.monotonic() > deadline:
            pytest.fail(
                f"the stream was still open {ENDS_WITHIN_SECONDS} s after its credentials went: {lines[-5:]}"
            )
    return lines


def test_a_stream_opened_with_a_token_ends_when_its_key_is_revoked_and_the_token_opens_nothing(
    tenant, run, web_rechecking
):
    key = create_api_key(tenant=tenant, name="browser").secret
    token = httpx.post(
        f"{web_rechecking.base}/api/runs/{run.pk}/stream-token", headers=bearer(key), timeout=5
    ).json()["token"]
    url = f"{web_rechecking.base}/api/runs/{run.pk}/events?token={token}"

    with httpx.stream("GET", url, timeout=10) as response:
        assert response.status_code == 200
        lines = read_until_closed(response, then=lambda: revoke(key))

    assert any("no longer hold" in line for line in lines)
    status, body = first_answer(url)
    assert status == 401 and "revoked" in body["detail"]


def test_a_token_of_a_key_revoked_before_it_is_used_is_refused(tenant, run, web_rechecking):
    key = create_api_key(tenant=tenant, name="browser").secret
    token = httpx.post(
        f"{web_rechecking.base}/api/runs/{run.pk}/stream-token", headers=bearer(key), timeout=5
    ).json()["token"]
    revoke(key)

    status, body = first_answer(f"{web_rechecking.base}/api/runs/{run.pk}/events?token={token}")

    assert status == 401 and "revoked" in body["detail"]


def test_a_stream_opened_with_a_key_ends_when_the_key_is_revoked(tenant, run, web_rechecking):
    key = create_api_key(tenant=tenant, name="client").secret
    other = create_api_key(tenant=tenant, name="other").secret

    with (
        httpx.stream(
            "GET",
            f"{web_rechecking.base}/api/runs/{run.pk}/events",
            headers=bearer(key),
            timeout=10,
        ) as response,
        httpx.stream(
            "GET",
            f"{web_rechecking.base}/api/runs/{run.pk}/events",
            headers=bearer(other),
            timeout=10,
        ) as kept,
    ):
        assert response.status_code == 200 and kept.status_code == 200
        read_until_closed(response, then=lambda: revoke(key))
        # The other key's stream of the same run stays open.
        assert next(kept.iter_lines()).startswith(("retry:", ":"))


@pytest.mark.parametrize("how", ["leaves the tenant", "logs out"])
def test_a_stream_opened_with_the_session_ends_when_the_user_leaves_the_tenant_or_logs_out(
    tenant, run, web_rechecking, how
):
    membership = MembershipFactory(tenant=tenant, role="viewer")
    cookie = session_of(membership.user)

    def go():
        if how == "leaves the tenant":
            Membership.objects.filter(pk=membership.pk).delete()
        else:
            Session.objects.filter(session_key=cookie["Cookie"].split("=", 1)[1]).delete()

    with httpx.stream(
        "GET", f"{web_rechecking.base}/api/runs/{run.pk}/events", headers=cookie, timeout=10
    ) as response:
        assert response.status_code == 200
        read_until_closed(response, then=go)
