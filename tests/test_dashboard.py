"""The dashboard through Django's test client: login, tenant scoping, progress partial, escaping."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from runs.models import Run
from runs.services import submit_run
from tests.conftest import fresh
from tests.factories import MembershipFactory, TenantFactory, UserFactory
from workers.worker import Worker, WorkerOptions

HTMX = {"HX-Request": "true"}
XSS = "<script>alert(1)</script>"


def run_worker_until_idle() -> None:
    Worker(WorkerOptions(burst=True, heartbeat=1, lease=10, listen=False)).run()


@pytest.fixture
def member(db):
    return MembershipFactory()


@pytest.fixture
def member_client(client, member):
    client.force_login(member.user)
    return client


def detail_url(run) -> str:
    return f"/runs/{run.id}/"


def force_status(run: Run, status: str, **fields) -> Run:
    """Test setup only: put a run in a state without executing it."""
    if status == "running":
        fields.update(
            lease_token=1,
            locked_by=uuid.uuid4(),
            locked_until=timezone.now() + timedelta(minutes=5),
        )
    Run.objects.filter(pk=run.pk).update(status=status, **fields)
    return fresh(run)


# Authentication and tenant scoping


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/", f"/runs/{uuid.uuid4()}/"])
def test_anonymous_user_is_redirected_to_login(client, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={path}"


@pytest.mark.django_db
def test_login_page_renders_a_form(client):
    response = client.get("/accounts/login/?next=/")

    assert response.status_code == 200
    assert b'name="username"' in response.content
    assert b'name="password"' in response.content
    assert b"csrfmiddlewaretoken" in response.content


@pytest.mark.django_db
def test_logging_in_through_the_form_leads_to_the_run_list(client, member):
    response = client.post(
        "/accounts/login/",
        {"username": member.user.username, "password": "secret-pass", "next": "/"},
        follow=True,
    )

    assert response.redirect_chain == [("/", 302)]
    assert response.status_code == 200
    assert b"<h1>Runs</h1>" in response.content


@pytest.mark.django_db
def test_member_sees_only_their_tenants_runs(member_client, member):
    mine = submit_run(tenant=member.tenant, kind="echo", input={"text": "mine"})
    theirs = submit_run(tenant=TenantFactory(), kind="echo", input={"text": "theirs"})

    response = member_client.get("/")

    assert response.status_code == 200
    assert detail_url(mine) in response.content.decode()
    assert detail_url(theirs) not in response.content.decode()
    assert member.tenant.name in response.content.decode()


@pytest.mark.django_db
def test_another_tenants_run_is_not_found(member_client):
    theirs = submit_run(tenant=TenantFactory(), kind="echo", input={"text": "theirs"})

    assert member_client.get(detail_url(theirs)).status_code == 404
    assert member_client.get(detail_url(theirs), headers=HTMX).status_code == 404


@pytest.mark.django_db
def test_unknown_run_is_not_found(member_client):
    assert member_client.get(f"/runs/{uuid.uuid4()}/").status_code == 404


@pytest.mark.django_db
def test_user_without_membership_gets_404(client):
    client.force_login(UserFactory())

    assert client.get("/").status_code == 404


@pytest.mark.django_db
def test_empty_run_list_says_so(member_client):
    response = member_client.get("/")

    assert response.status_code == 200
    assert b"No runs yet" in response.content


# The run page and its progress partial


@pytest.mark.django_db
def test_run_page_shows_status_current_step_and_steps_done(member_client, member):
    run = submit_run(tenant=member.tenant, kind="steps", input={"steps": 4})
    force_status(run, "running", current_step="step2", steps_done=1, steps_total=4)

    response = member_client.get(detail_url(run))

    assert response.status_code == 200
    assert "runs/detail.html" in [t.name for t in response.templates]
    html = response.content.decode()
    assert '<span class="status status-running" data-testid="status">Running</span>' in html
    assert '<dd data-testid="current-step">step2</dd>' in html
    assert '<dd data-testid="steps-done">1 of 4</dd>' in html
    assert '<progress max="4" value="1"' in html
    # While the run can still change, the progress section polls itself.
    assert f'hx-get="{detail_url(run)}" hx-trigger="every 2s"' in html
    assert "<html" in html and "← All runs" in html


@pytest.mark.django_db
def test_queued_run_page_shows_placeholders(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})

    html = member_client.get(detail_url(run)).content.decode()

    assert 'data-testid="status">Queued</span>' in html
    assert '<dd data-testid="current-step">—</dd>' in html
    assert '<dd data-testid="steps-done">0</dd>' in html


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["queued", "running", "paused", "waiting", "waiting_human"])
def test_htmx_partial_of_a_live_run_is_200_and_keeps_polling(member_client, member, status):
    run = force_status(submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}), status)

    response = member_client.get(detail_url(run), headers=HTMX)

    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="progress"')
    assert html.rstrip().endswith("</section>")
    assert "<html" not in html and "<header" not in html and "All runs" not in html
    assert 'hx-trigger="every 2s"' in html
    assert f'data-testid="status">{run.get_status_display()}</span>' in html


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["done", "failed", "cancelled"])
def test_htmx_partial_of_a_terminal_run_is_286_and_stops_polling(member_client, member, status):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        status,
        finished_at=timezone.now(),
    )

    response = member_client.get(detail_url(run), headers=HTMX)

    assert response.status_code == 286
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="progress"')
    assert "<html" not in html
    # The swapped-in fragment carries no trigger of its own either.
    assert "hx-get" not in html and "hx-trigger" not in html


@pytest.mark.django_db
def test_full_page_of_a_terminal_run_is_200_without_polling(member_client, member):
    run = force_status(
        submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"}),
        "done",
        finished_at=timezone.now(),
    )

    response = member_client.get(detail_url(run))

    assert response.status_code == 200
    assert b"hx-trigger" not in response.content


@pytest.mark.django_db
def test_htmx_partial_query_count_is_pinned(member_client, member, django_assert_num_queries):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})

    # session, user, membership with its tenant, run, steps
    with django_assert_num_queries(5):
        response = member_client.get(detail_url(run), headers=HTMX)

    assert response.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_executed_run_reports_done_with_its_result_and_steps(client):
    member = MembershipFactory()
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi", "times": 2})

    assert client.get(detail_url(run), headers=HTMX).status_code == 200
    run_worker_until_idle()
    assert fresh(run).status == "done"

    partial = client.get(detail_url(run), headers=HTMX)
    assert partial.status_code == 286
    html = partial.content.decode()
    assert 'data-testid="status">Done</span>' in html
    assert '<dd data-testid="current-step">—</dd>' in html  # cleared once done
    assert '<dd data-testid="steps-done">1</dd>' in html
    assert (
        '<pre class="result" data-testid="result">{\n  &quot;echo&quot;: &quot;hihi&quot;\n}</pre>'
        in html
    )
    # The step timeline is part of the polled fragment, so it grows without a reload.
    assert "<strong>repeat</strong>" in html


@pytest.mark.django_db(transaction=True)
def test_failed_run_shows_its_error_and_stops_polling(client):
    member = MembershipFactory()
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="broken", input={})

    run_worker_until_idle()

    assert fresh(run).status == "failed"
    response = client.get(detail_url(run), headers=HTMX)
    assert response.status_code == 286
    html = response.content.decode()
    assert 'data-testid="status">Failed</span>' in html
    assert "Error (fatal)" in html
    assert "the CRM rejected the record: field &#x27;email&#x27; is invalid" in html


# Untrusted output is escaped


@pytest.mark.django_db(transaction=True)
def test_html_in_a_result_is_escaped(client):
    member = MembershipFactory()
    client.force_login(member.user)
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": XSS})

    run_worker_until_idle()

    assert fresh(run).result == {"echo": XSS}
    for response in (client.get(detail_url(run)), client.get(detail_url(run), headers=HTMX)):
        html = response.content.decode()
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        assert XSS not in html
        assert "<script>alert" not in html


@pytest.mark.django_db
def test_html_in_an_error_and_in_a_step_name_is_escaped(member_client, member):
    run = submit_run(tenant=member.tenant, kind="echo", input={"text": "hi"})
    force_status(
        run,
        "failed",
        finished_at=timezone.now(),
        error_kind="fatal",
        error='tool said: <img src=x onerror="alert(1)">',
        current_step=XSS,
    )
    run.steps.create(seq=1, name=XSS, status="failed")

    for response in (
        member_client.get(detail_url(run)),
        member_client.get(detail_url(run), headers=HTMX),
    ):
        html = response.content.decode()
        assert "<img" not in html
        assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in html
        assert "<script>alert" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
