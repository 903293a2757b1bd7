"""The run page on its event stream, and the run's webhook deliveries.

The browser tests run the production web server (``manage.py serve``,
ASGI: Django's ``live_server`` is WSGI, where an event stream is only sent
once it has ended) and a worker as real processes, and drive Debian's
Chromium through Playwright (see tests/support/browser.py, whose
helpers they share). Like those, they write to the database before opening
the browser and read it after closing it: Playwright's loop in this thread
keeps the ORM out meanwhile.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient, Client
from django.utils import timezone

from runs.events import SYSTEM, append_event
from runs.models import DeliveryStatus, Event, Run, WebhookDelivery
from runs.services import submit_run
from tests.conftest import free_port, fresh
from tests.support.browser import assert_accessible, browser_page, log_in, screenshot, screenshots  # noqa: F401
from tests.support.factories import MembershipFactory
from tests.support.run_states import force_status
from tests.support.waiting import wait_until

HTMX = {"HX-Request": "true"}
LIVE_NOTE = "Live: this page follows the run as it moves."


class WebServer:
    """``manage.py serve`` on a loopback port, killed and started again on the same port by ``restart``."""

    def __init__(self, processes):
        self.processes = processes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> None:
        self.proc = self.processes.manage("serve", f"127.0.0.1:{self.port}")
        wait_until(
            self._answers, timeout=30, interval=0.1, what="manage.py serve to answer /api/health"
        )

    def restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.start()

    def _answers(self) -> bool:
        assert self.proc.poll() is None, self.processes.output(self.proc)
        try:
            with urllib.request.urlopen(self.url + "/api/health", timeout=1) as response:
                return response.status == 200
        except OSError:
            return False


@pytest.fixture
def web_server(processes):
    server = WebServer(processes)
    server.start()
    return server


def hold_steps_run(tenant, hold, *, steps: int) -> Run:
    """A run of ``steps`` 1 s steps whose first one waits while the file ``hold`` exists."""
    hold.touch()
    return submit_run(
        tenant=tenant,
        kind="steps",
        input={
            "steps": steps,
            "step_seconds": 1,
            "block_at": 1,
            "block_file": str(hold),
        },
    )


def wait_current_step(run: Run, name: str, worker, processes) -> None:
    def reached():
        assert worker.poll() is None, processes.output(worker)
        return fresh(run).current_step == name

    wait_until(reached, what=f"run {run.id} to show {name} in progress")


class RequestLog:
    """The browser's requests for one run page: its polls, the stream's re-fetches, the event streams."""

    def __init__(self, page, run: Run):
        self.run_path = f"/runs/{run.id}/"
        self.entries: list[tuple[float, str]] = []
        page.on("request", lambda request: self.entries.append((time.monotonic(), request.url)))

    def polls(self, since: float = 0) -> list[float]:
        return [
            at
            for at, url in self.entries
            if at >= since and self._partial(url) and "via=stream" not in url
        ]

    def refetches(self) -> list[str]:
        return [url for _, url in self.entries if self._partial(url) and "via=stream" in url]

    def streams(self, since: float = 0) -> list[str]:
        return [
            url for at, url in self.entries if at >= since and f"/api{self.run_path}events" in url
        ]

    def for_the_run(self, since: float) -> list[str]:
        return [url for at, url in self.entries if at >= since and self.run_path in url]

    def _partial(self, url: str) -> bool:
        return f"{self.run_path}?" in url and "state=" in url


def page_errors(page) -> list[str]:
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


@pytest.mark.django_db(transaction=True)
def test_the_run_page_follows_the_event_stream_and_does_not_poll(
    chromium, web_server, processes, tmp_path
):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", role="operator")
    hold = tmp_path / "hold"
    run = hold_steps_run(member.tenant, hold, steps=6)
    worker = processes.worker("--heartbeat", "1", "--poll", "0.5")
    wait_current_step(run, "step1", worker, processes)

    with browser_page(chromium) as page:
        errors = page_errors(page)
        log = RequestLog(page, run)
        log_in(page, web_server.url, member.user.username)
        page.goto(f"{web_server.url}/runs/{run.id}/")
        expect(page.get_by_text(LIVE_NOTE)).to_be_visible()
        expect(page.get_by_test_id("status")).to_have_text("Running")
        expect(page.get_by_test_id("current-step")).to_have_text("step1")
        expect(page.get_by_test_id("steps-done")).to_have_text("0 of 6")
        # Nothing happens for more than two polling periods (a moving run's re-fetches would
        # replace the polled section, and its poll timer with it, before a poll was due).
        page.wait_for_timeout(5_000)
        assert page.evaluate("window.runStreamOpen") is True

        hold.unlink()
        # Steps come in one by one, from the stream: the counter, the bar, the timeline.
        expect(page.get_by_test_id("steps-done")).to_have_text("3 of 6", timeout=20_000)
        expect(page.locator("progress")).to_have_attribute("value", re.compile("^[3-6]$"))
        expect(page.get_by_test_id("step").nth(2).locator(".badge")).to_have_text("Done")
        expect(page.get_by_test_id("status")).to_have_text("Running")

        expect(page.get_by_test_id("status")).to_have_text("Done", timeout=30_000)
        # The last re-fetch brings the server's page of a finished run.
        expect(page.get_by_role("heading", name="Result", exact=True)).to_be_visible()
        finished_at = time.monotonic()
        expect(page.get_by_test_id("result")).to_contain_text('"steps": 6')
        expect(page.get_by_test_id("steps-done")).to_have_text("6 of 6")
        expect(page.get_by_test_id("step").locator(".step-name")).to_have_text(
            [f"step{n}" for n in range(1, 7)]
        )
        expect(page.get_by_test_id("step").locator(".badge")).to_have_text(["Done"] * 6)
        expect(page.get_by_text(LIVE_NOTE)).to_be_hidden()
        page.wait_for_timeout(
            4_000
        )  # no poll in 4 s after the end: behaviour under test, not a wait

        assert errors == []
        assert log.polls() == [], "the page polled while it followed the stream"
        assert len(log.refetches()) >= 3  # one per step or so, at most every 300 ms
        # One stream, opened after the Events the page was rendered with, and closed at the end:
        # no reconnect (which would get a 204), no request at all for the finished run.
        [stream] = log.streams()
        assert re.search(r"[?&]last_event_id=[1-9]\d*", stream)
        assert log.for_the_run(since=finished_at) == []

    assert fresh(run).status == "done"


@pytest.mark.django_db(transaction=True)
def test_when_the_stream_is_cut_the_page_falls_back_to_polling(
    chromium, web_server, processes, tmp_path
):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", role="operator")
    hold = tmp_path / "hold"
    run = hold_steps_run(member.tenant, hold, steps=10)
    worker = processes.worker("--heartbeat", "1", "--poll", "0.5")
    wait_current_step(run, "step1", worker, processes)

    with browser_page(chromium) as page:
        errors = page_errors(page)
        log = RequestLog(page, run)
        log_in(page, web_server.url, member.user.username)
        page.goto(f"{web_server.url}/runs/{run.id}/")
        expect(page.get_by_text(LIVE_NOTE)).to_be_visible()
        hold.unlink()
        expect(page.get_by_test_id("steps-done")).to_have_text("2 of 10", timeout=20_000)

        # The stream goes away for good: the server dies, and no stream gets through again.
        page.route("**/events*", lambda route: route.abort())
        cut_at = time.monotonic()
        web_server.restart()

        expect(page.get_by_text(LIVE_NOTE)).to_be_hidden()
        # Polling takes over, and the page keeps moving until the run is done.
        expect(page.get_by_test_id("steps-done")).to_have_text(
            re.compile(r"^[5-9] of 10$"), timeout=30_000
        )
        expect(page.get_by_test_id("status")).to_have_text("Done", timeout=40_000)
        expect(page.get_by_role("heading", name="Result", exact=True)).to_be_visible()
        finished_at = time.monotonic()
        expect(page.get_by_test_id("steps-done")).to_have_text("10 of 10")
        expect(page.get_by_test_id("step").locator(".badge")).to_have_text(["Done"] * 10)
        page.wait_for_timeout(3_000)  # no poll after the end either: behaviour, not a wait

        assert errors == []
        assert log.polls(since=0) == log.polls(since=cut_at), (
            "the page polled while the stream was open"
        )
        assert len(log.polls(since=cut_at)) >= 2, "the page did not fall back to polling"
        # It tried the stream again a few times, then left it to polling.
        assert len(log.streams(since=cut_at)) >= 1
        assert log.streams(since=finished_at) == []
        assert log.for_the_run(since=finished_at) == []  # the 286 answer stopped the polls

    assert fresh(run).status == "done"


@pytest.mark.django_db(transaction=True)
def test_model_text_shows_in_the_live_output_box_while_the_model_call_runs(
    chromium, web_server, processes
):
    from playwright.sync_api import expect

    member = MembershipFactory(tenant__name="Acme Research", role="operator")
    prompt = "Which kettle boils water fastest, and which one is the quietest of them all?"
    run = submit_run(tenant=member.tenant, kind="llm_agent", input={"prompt": prompt})
    # The scripted model (no LLM_BASE_URL) answers in four pieces over 0.4 s x 25 = 10 s.
    worker = processes.worker(
        "--heartbeat", "1", "--poll", "0.5", RUNS_DEMO_DELAY_SCALE="25", LLM_BASE_URL=""
    )
    wait_current_step(run, "Thinking (iteration 1)", worker, processes)

    with browser_page(chromium) as page:
        errors = page_errors(page)
        log_in(page, web_server.url, member.user.username)
        page.goto(f"{web_server.url}/runs/{run.id}/")
        expect(page.get_by_text(LIVE_NOTE)).to_be_visible()
        live = page.get_by_test_id("live-output")
        # The text so far, piece by piece (the last piece comes with the step's end).
        expect(live).to_contain_text("(scripted model) You said:", timeout=20_000)
        expect(
            page.get_by_role("heading", name=re.compile(r"^Live output · model call 1$"))
        ).to_be_visible()
        expect(live).to_contain_text("You said: Which kettle boils water fastest,", timeout=20_000)
        assert_accessible(page)
        screenshots(page, "run-live")
        # The call's step is done: the box goes, and the timeline has the answer.
        expect(page.get_by_test_id("status")).to_have_text("Done", timeout=30_000)
        expect(live).to_be_hidden()
        expect(page.get_by_test_id("result")).to_contain_text("quietest of them all?")
        assert errors == []


# The stream's markup: only an ASGI server's page of a live run follows one.


@pytest.mark.django_db
def test_a_live_run_page_served_by_asgi_follows_the_stream_after_the_events_it_shows():
    member = MembershipFactory(role="viewer")
    run = force_status(
        submit_run(tenant=member.tenant, kind="steps", input={"steps": 2}), "running"
    )
    done = force_status(
        submit_run(tenant=member.tenant, kind="steps", input={"steps": 2}),
        "done",
        finished_at=timezone.now(),
    )
    client = AsyncClient()
    client.force_login(member.user)

    html = async_to_sync(client.get)(f"/runs/{run.id}/").content.decode()
    assert (
        f'data-stream-url="/api/runs/{run.id}/events?last_event_id={fresh(run).last_event_seq}"'
        in html
    )
    assert '<script src="/static/js/run-stream.js" defer></script>' in html
    assert (
        '<script id="run-status-labels" type="application/json">' in html
        and '"done": "Done"' in html
    )
    # Polling stays in the markup: the script holds it back while the stream is open.
    assert 'hx-trigger="every 2s, visibilitychange from:document" data-poll-visible' in html

    finished = async_to_sync(client.get)(f"/runs/{done.id}/").content.decode()
    assert "data-stream-url" not in finished and "run-stream.js" not in finished


@pytest.mark.django_db
def test_under_wsgi_the_run_page_polls_and_opens_no_stream(client):
    member = MembershipFactory(role="viewer")
    run = force_status(
        submit_run(tenant=member.tenant, kind="steps", input={"steps": 2}), "running"
    )
    client.force_login(member.user)

    html = client.get(f"/runs/{run.id}/").content.decode()
    assert "data-stream-url" not in html and "run-stream.js" not in html
    assert 'hx-trigger="every 2s, visibilitychange from:document" data-poll-visible' in html


# Webhook deliveries


def done_event(run: Run) -> Event:
    """The run.done Event a delivery is made of (test setup only)."""
    seq = append_event(run_id=run.id, type="run.done", actor=SYSTEM)
    return Event.objects.get(run=run, seq=seq)


def finished_run_with_event(tenant) -> tuple[Run, Event]:
    run = force_status(
        submit_run(tenant=tenant, kind="echo", input={"text": "hi"}),
        "done",
        finished_at=timezone.now(),
    )
    event = done_event(run)
    return fresh(run), event


def delivery(
    event: Event, status: str, *, url: str = "https://hooks.example.com/runs", **fields
) -> WebhookDelivery:
    run = event.run
    return WebhookDelivery.objects.create(
        event=event,
        run=run,
        tenant_id=run.tenant_id,
        url=url,
        event_type=event.type,
        webhook_id=f"msg_{run.id.hex}_{event.seq}",
        status=status,
        **fields,
    )


def logged_in(role: str, tenant=None) -> tuple[Client, object]:
    membership = MembershipFactory(role=role, **({"tenant": tenant} if tenant else {}))
    client = Client()
    client.force_login(membership.user)
    return client, membership


def rows(html: str) -> list[str]:
    return re.findall(r'<tr data-testid="delivery">(.*?)</tr>', html, flags=re.S)


@pytest.mark.django_db
def test_the_run_page_lists_its_deliveries_newest_first_with_redeliver_for_finished_ones():
    client, member = logged_in("operator")
    run, event = finished_run_with_event(member.tenant)
    now = timezone.now()
    delivered = delivery(
        event, DeliveryStatus.DELIVERED, attempts=1, response_code=200, delivered_at=now
    )
    dead = delivery(
        event,
        DeliveryStatus.DEAD,
        url="https://hooks.example.com/in?token=s3cret-token",
        attempts=7,
        response_code=500,
        last_error="HTTP 500 from the receiver <script>x</script>",
        last_attempt_at=now - timedelta(hours=3),
    )
    pending = delivery(
        event,
        DeliveryStatus.PENDING,
        attempts=2,
        last_error="timed out after 10 s (10.1.2.3)",
        failure="timeout",
        next_attempt_at=now + timedelta(minutes=5),
    )

    html = client.get(f"/runs/{run.id}/").content.decode()

    assert "Webhook deliveries" in html
    newest, middle, oldest = rows(html)
    assert (
        "Pending" in newest
        and "the receiver did not answer" in newest
        and "next attempt in 4 min" in newest
    )
    assert "Dead" in middle and "HTTP 500" in middle and "the receiver answered 500" in middle
    # The sender's own error sentence is the operators' (the admin's): it can name addresses and ports.
    assert "10.1.2.3" not in html and "<script>x" not in html and "&lt;script&gt;x" not in html
    assert "gave up 3 h ago" in middle
    assert "Delivered" in oldest and "HTTP 200" in oldest and "delivered 0 s ago" in oldest
    # A token in the query string is not shown.
    assert "s3cret-token" not in html and "https://hooks.example.com/in?…" in middle
    # Redeliver for the delivered and the dead one; the pending one is still being attempted.
    assert f'action="/runs/{run.id}/deliveries/{dead.pk}/redeliver/"' in middle
    assert f'action="/runs/{run.id}/deliveries/{delivered.pk}/redeliver/"' in oldest
    assert "Redeliver" not in newest and f"/deliveries/{pending.pk}/" not in html
    assert html.count('name="csrfmiddlewaretoken"') >= 2


@pytest.mark.django_db
def test_redeliver_sends_the_event_again_as_a_new_delivery():
    client, member = logged_in("operator")
    run, event = finished_run_with_event(member.tenant)
    dead = delivery(event, DeliveryStatus.DEAD, attempts=7, last_error="HTTP 500")

    response = client.post(f"/runs/{run.id}/deliveries/{dead.pk}/redeliver/", follow=True)

    assert response.redirect_chain == [(f"/runs/{run.id}/", 302)]
    assert [str(m) for m in response.context["messages"]] == [
        "The run.done webhook will be sent again."
    ]
    again = WebhookDelivery.objects.exclude(pk=dead.pk).get()
    assert (again.event_id, again.url, again.webhook_id, again.status, again.attempts) == (
        event.pk,
        dead.url,
        dead.webhook_id,
        "pending",
        0,
    )
    # The page shows it at the top, without a button while it is attempted.
    newest, older = rows(response.content.decode())
    assert "Pending" in newest and "Redeliver" not in newest
    assert "Dead" in older and "Redeliver" in older


@pytest.mark.django_db
def test_redelivering_a_delivery_that_is_still_attempted_changes_nothing_and_says_why():
    client, member = logged_in("operator")
    run, event = finished_run_with_event(member.tenant)
    sending = delivery(event, DeliveryStatus.SENDING, attempts=1)

    response = client.post(f"/runs/{run.id}/deliveries/{sending.pk}/redeliver/", follow=True)

    assert response.status_code == 200
    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith("Nothing changed: this delivery is still being attempted")
    assert WebhookDelivery.objects.count() == 1


@pytest.mark.django_db
def test_a_viewer_sees_no_redeliver_button_and_a_forged_post_is_refused():
    client, member = logged_in("viewer")
    run, event = finished_run_with_event(member.tenant)
    delivered = delivery(event, DeliveryStatus.DELIVERED, attempts=1, delivered_at=timezone.now())

    html = client.get(f"/runs/{run.id}/").content.decode()
    assert "Webhook deliveries" in html and "Redeliver" not in html

    response = client.post(f"/runs/{run.id}/deliveries/{delivered.pk}/redeliver/")
    assert response.status_code == 403
    assert WebhookDelivery.objects.count() == 1


@pytest.mark.django_db
def test_another_runs_or_tenants_delivery_is_not_found():
    client, member = logged_in("operator")
    run, _ = finished_run_with_event(member.tenant)
    other_run, other_event = finished_run_with_event(member.tenant)
    elsewhere = delivery(other_event, DeliveryStatus.DEAD)
    _, stranger = logged_in("operator")
    foreign_run, foreign_event = finished_run_with_event(stranger.tenant)
    foreign = delivery(foreign_event, DeliveryStatus.DEAD)

    assert client.post(f"/runs/{run.id}/deliveries/{elsewhere.pk}/redeliver/").status_code == 404
    assert (
        client.post(f"/runs/{foreign_run.id}/deliveries/{foreign.pk}/redeliver/").status_code == 404
    )
    assert client.get(f"/runs/{run.id}/deliveries/{elsewhere.pk}/redeliver/").status_code == 405
    assert WebhookDelivery.objects.count() == 2


@pytest.mark.django_db
def test_the_section_is_hidden_without_deliveries_and_shows_the_latest_20(
    django_assert_num_queries,
):
    client, member = logged_in("operator")
    run, event = finished_run_with_event(member.tenant)
    assert "Webhook deliveries" not in client.get(f"/runs/{run.id}/").content.decode()

    made = [delivery(event, DeliveryStatus.DEAD, attempts=n) for n in range(25)]
    # session, user, memberships with their tenants, run, messages, steps, the activity's Events, deliveries
    with django_assert_num_queries(8):
        html = client.get(f"/runs/{run.id}/").content.decode()
    shown = rows(html)
    assert len(shown) == 20
    assert f"/deliveries/{made[-1].pk}/redeliver/" in shown[0]
    assert f"/deliveries/{made[5].pk}/redeliver/" in shown[-1]


@pytest.mark.django_db
def test_the_poll_that_sees_a_run_finish_brings_its_deliveries():
    client, member = logged_in("viewer")
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}), "running"
    )
    page = client.get(f"/runs/{run.id}/").content.decode()
    poll_url = re.search(r'hx-get="([^"]+)"', page).group(1).replace("&amp;", "&")
    # A poll of a running run does not look for deliveries: no Event it may have had writes one.
    assert 'id="deliveries"' not in client.get(poll_url, headers=HTMX).content.decode()

    force_status(run, "done", finished_at=timezone.now())
    delivery(done_event(run), DeliveryStatus.PENDING)
    response = client.get(poll_url, headers=HTMX)

    assert response.status_code == 286
    html = response.content.decode()
    assert '<section id="deliveries" class="deliveries" hx-swap-oob="true">' in html
    assert len(rows(html)) == 1
