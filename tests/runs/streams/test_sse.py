"""Event streams served by a real ASGI server process (`manage.py serve`), read by a real HTTP client.

Resuming across a server restart with Last-Event-ID, finished runs, credentials (stream tokens, keys in
query strings, sessions), keep-alive comments, ephemeral updates, the connections a process holds, and
streams without LISTEN.
"""

from __future__ import annotations

import signal
import time

import httpx
import pytest
from django.db import connection

from runs import control
from runs.events import Actor
from runs.keys import create_api_key
from runs.models import ApiKey, Event, StreamWatch
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.factories import MembershipFactory, TenantFactory
from tests.support.fake_openai import drive
from tests.support.waiting import wait_until
from tests.support.web import SSE, Web, bearer, first_answer, read_events, session_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def web(processes):
    return Web(processes, RUNS_STREAM_KEEPALIVE_SECONDS="0.5").start()


def stored_events(run) -> list[tuple[int, str]]:
    return list(Event.objects.filter(run=run).order_by("seq").values_list("seq", "type"))


def test_a_client_resumes_after_a_server_restart_and_sees_every_event_once_in_order(
    tenant, api_key, web, processes
):
    run = submit_run(tenant=tenant, kind="chatty", input={"steps": 6, "pause": 0.4})
    processes.worker("--heartbeat", "1", "--poll", "0.2")
    seen: list[SSE] = []
    url = f"{web.base}/api/runs/{run.pk}/events"
    with httpx.stream("GET", url, headers=bearer(api_key), timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        read_events(response, seen=seen, until=lambda e: e.event == "step.done")

    web.stop(signal.SIGKILL)  # no goodbye: the client is cut off mid-stream
    web.start()
    last = max(e.id for e in seen if e.id is not None)
    with httpx.stream(
        "GET", url, headers=bearer(api_key) | {"Last-Event-ID": str(last)}, timeout=60
    ) as response:
        read_events(response, seen=seen)  # to the end: the stream closes after the terminal event

    stored = [(e.id, e.event) for e in seen if e.id is not None]
    assert fresh(run).status == "done"
    assert stored == stored_events(run)  # every Event, once, in order, across the restart
    assert stored[-1][1] == "run.done"
    done = seen[-1].data
    assert done["data"]["result"] == {"ticks": 6} and done["data"]["steps_done"] == 6
    # A timeline and a progress bar can be drawn from them.
    types = {e.event for e in seen}
    assert {
        "run.queued",
        "run.running",
        "step.started",
        "step.done",
        "progress",
        "run.done",
    } <= types
    step_done = next(e for e in seen if e.event == "step.done").data["data"]
    assert {
        "seq",
        "name",
        "kind",
        "tokens_in",
        "tokens_out",
        "cost_cents",
        "steps_done",
        "steps_total",
    } <= set(step_done)
    assert step_done["steps_total"] == 6
    progress = next(e for e in seen if e.event == "progress").data["data"]
    assert progress["message"].endswith("of 6 done")
    # The steps' emitted ticks came live, without an id (never replayed).
    ticks = [e for e in seen if e.event == "tick"]
    assert ticks and all(e.id is None for e in ticks)
    assert {t.data["data"]["of"] for t in ticks} == {6}


def test_the_stream_of_a_finished_run_replays_its_events_and_closes(tenant, api_key, web):
    run = submit_run(tenant=tenant, kind="echo", input={"text": "hi"})
    drive(run)
    url = f"{web.base}/api/runs/{run.pk}/events"
    started = time.monotonic()
    with httpx.stream("GET", url, headers=bearer(api_key), timeout=10) as response:
        seen = read_events(response)
    assert time.monotonic() - started < 5  # it closed by itself (keep-alives come every 0.5 s)
    assert [(e.id, e.event) for e in seen] == stored_events(run)
    # Resuming from the end: nothing left, and 204 tells EventSource not to reconnect.
    last = stored_events(run)[-1][0]
    again = httpx.get(url, headers=bearer(api_key) | {"Last-Event-ID": str(last)}, timeout=10)
    assert again.status_code == 204
    middle = httpx.get(url + "?last_event_id=2", headers=bearer(api_key), timeout=10)
    assert [int(line[4:]) for line in middle.text.splitlines() if line.startswith("id: ")] == list(
        range(3, last + 1)
    )


def test_an_idle_stream_gets_keepalive_comments_and_ends_when_the_run_is_cancelled(
    tenant, api_key, web
):
    run = submit_run(tenant=tenant, kind="echo", input={"text": "no worker runs it"})
    comments: list[str] = []
    url = f"{web.base}/api/runs/{run.pk}/events"
    with httpx.stream("GET", url, headers=bearer(api_key), timeout=10) as response:
        seen = read_events(response, comments=comments, until=lambda e: e.event == "run.queued")
        wait_until(
            lambda: StreamWatch.objects.filter(run_id=run.pk).exists(),
            what="the run to be watched",
        )
        read_events(
            response,
            seen=seen,
            comments=comments,
            comments_until=lambda got: sum(c.startswith(": keepalive") for c in got) >= 2,
        )
        control.cancel_run(run=run, actor=Actor(type="user", id="1"))
        read_events(response, seen=seen, comments=comments)
    assert [e.event for e in seen] == ["run.queued", "run.cancelled"]
    assert sum(c.startswith(": keepalive") for c in comments) >= 2
    wait_until(
        lambda: not StreamWatch.objects.filter(run_id=run.pk).exists(),
        what="the watch to be dropped",
    )


def test_stream_credentials(tenant, api_key, web):
    run_a = submit_run(tenant=tenant, kind="echo", input={"text": "a"})
    run_b = submit_run(tenant=tenant, kind="echo", input={"text": "b"})
    other = submit_run(tenant=TenantFactory(), kind="echo", input={"text": "other tenant"})
    events = f"{web.base}/api/runs/{{}}/events"

    def get(run, params="", headers=None):
        return first_answer(events.format(run.pk) + params, headers)

    # A stream token opens run A's stream, and only run A's.
    token = httpx.post(
        f"{web.base}/api/runs/{run_a.pk}/stream-token", headers=bearer(api_key), timeout=5
    ).json()
    assert token["url"].endswith(f"?token={token['token']}")
    assert get(run_a, f"?token={token['token']}")[0] == 200
    status, body = get(run_b, f"?token={token['token']}")
    assert status == 401 and "another run" in body["detail"]
    # API keys never travel in a query string, whatever the parameter's name.
    for params in (f"?api_key={api_key}", f"?token={api_key}", f"?access_token={api_key}"):
        status, body = get(run_a, params)
        assert status == 401 and "never accepted in a query string" in body["detail"], params
    # No credentials; another tenant's run; a key without runs:read.
    assert get(run_a)[0] == 401
    assert get(other, headers=bearer(api_key))[0] == 404
    write_only = create_api_key(tenant=tenant, name="w", scopes=[ApiKey.Scope.WRITE]).secret
    assert get(run_a, headers=bearer(write_only))[0] == 403
    assert get(run_a, headers=bearer(api_key) | {"Last-Event-ID": "-3"})[0] == 422
    # The dashboard's session: a member of the run's tenant, whatever the role; nobody else.
    assert (
        get(run_a, headers=session_of(MembershipFactory(tenant=tenant, role="viewer").user))[0]
        == 200
    )
    outsider = MembershipFactory(role="approver").user  # of another tenant
    outsider.is_superuser = True
    outsider.save()
    assert get(run_a, headers=session_of(outsider))[0] == 404


def test_a_stream_token_expires(tenant, api_key, processes):
    web = Web(processes, RUNS_STREAM_TOKEN_SECONDS="1").start()
    run = submit_run(tenant=tenant, kind="echo", input={"text": "a"})
    token = httpx.post(
        f"{web.base}/api/runs/{run.pk}/stream-token", headers=bearer(api_key), timeout=5
    ).json()
    url = f"{web.base}/api/runs/{run.pk}/events?token={token['token']}"
    status, body = wait_until(
        lambda: (answer := first_answer(url))[0] != 200 and answer,
        timeout=15,
        interval=0.2,
        what="the token (of 1 s) to be refused",
    )
    assert status == 401 and "expired" in body["detail"]


def test_many_streams_share_a_bounded_number_of_connections(tenant, api_key, web):
    runs = [submit_run(tenant=tenant, kind="echo", input={"text": f"{i}"}) for i in range(40)]
    clients = []
    try:
        for run in runs:
            stream = httpx.stream(
                "GET", f"{web.base}/api/runs/{run.pk}/events", headers=bearer(api_key), timeout=10
            )
            response = stream.__enter__()
            assert response.status_code == 200
            clients.append((stream, response))
        wait_until(
            lambda: StreamWatch.objects.filter(run_id__in=[r.pk for r in runs]).count() == 40,
            what="every run watched",
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = 'agentruns serve'"
            )
            held = cursor.fetchone()[0]
        # One LISTEN connection, the hub's pool (4), and Django's own for the last requests.
        assert held <= 1 + 4 + 2, held
    finally:
        for stream, _ in clients:
            stream.__exit__(None, None, None)


def test_without_listen_streams_still_follow_the_run(tenant, api_key, processes):
    web = Web(processes, RUNS_LISTEN="0", RUNS_STREAM_POLL_SECONDS="0.2").start()
    run = submit_run(tenant=tenant, kind="chatty", input={"steps": 2, "pause": 0.2})
    processes.worker("--heartbeat", "1", "--poll", "0.2")
    with httpx.stream(
        "GET", f"{web.base}/api/runs/{run.pk}/events", headers=bearer(api_key), timeout=30
    ) as response:
        seen = read_events(response)
    assert [(e.id, e.event) for e in seen if e.id is not None] == stored_events(run)
    assert seen[-1].event == "run.done"
