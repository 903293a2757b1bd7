"""The operations console's pages: what they show, the queries they cost, and actions from a run's own page."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runs.admin.common import EstimatedCountPaginator
from runs.models import Run, Tenant, Worker
from tests.conftest import fresh
from tests.support.admin_helpers import (
    CHANGELIST,
    add_steps,
    last_event,
    make_run,
)
from tests.support.factories import TenantFactory

pytestmark = pytest.mark.django_db
HTMX = {"HX-Request": "true"}
OVERVIEW = "/admin/runs/run/overview/"


@pytest.fixture
def busy(tenant):
    """Runs of several tenants in every state the pages show, so an N+1 query would multiply."""
    others = [TenantFactory(), TenantFactory()]
    runs = [
        make_run(t, status)
        for t in [tenant, *others]
        for status in ("queued", "failed", "done", "running")
    ]
    runs.append(make_run(others[0], "running", locked_until=timezone.now() - timedelta(minutes=2)))
    # The pages count with the planner's estimate: statistics left by an earlier test's thousands
    # of rows would make these thirteen "about" a thousand, so the estimate is taken afresh.
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run")
    return runs


# The run list


def test_run_changelist_lists_runs_with_their_tenants_in_a_fixed_number_of_queries(
    operator_client, busy, django_assert_num_queries
):
    # session, user, the user's and the groups' permissions, EXPLAIN (the estimate), the exact
    # count of a small result (bounded), the page with its tenants (one join), the tenant
    # filter's choices, the queue filter's operator-made queues.
    operator_client.get(CHANGELIST)  # warm: the counts below are those of every later visit
    with django_assert_num_queries(9):
        response = operator_client.get(CHANGELIST)

    assert response.status_code == 200
    assert response.content.count(b'class="action-select"') == len(busy)
    assert str(busy[0].tenant.slug).encode() in response.content
    assert b"about" not in response.content.split(b'class="paginator"')[1][:300]


def test_filtered_changelist_costs_the_same_queries_and_shows_only_the_match(
    operator_client, busy, django_assert_num_queries
):
    url = f"{CHANGELIST}?status__exact=failed&kind=noop3"
    operator_client.get(url)
    with django_assert_num_queries(9):  # as the plain list: filters add conditions, not queries
        response = operator_client.get(url)

    assert response.content.count(b'class="action-select"') == 3
    assert b"3 runs" in response.content


def test_search_finds_a_run_by_id_or_by_idempotency_key(operator_client, tenant):
    from runs.services import submit_run

    keyed = submit_run(tenant=tenant, kind="noop3", input={}, idempotency_key="order-42")
    other = make_run(tenant)

    by_key = operator_client.get(f"{CHANGELIST}?q=order-42")
    by_id = operator_client.get(f"{CHANGELIST}?q={other.pk}")
    nothing = operator_client.get(f"{CHANGELIST}?q=order-4")

    assert str(keyed.pk).encode() in by_key.content and str(other.pk).encode() not in by_key.content
    assert str(other.pk).encode() in by_id.content and str(keyed.pk).encode() not in by_id.content
    assert nothing.content.count(b'class="action-select"') == 0


def test_the_paginator_uses_the_planners_estimate_instead_of_counting(
    tenant, django_assert_num_queries
):
    for _ in range(4):
        make_run(tenant)
    paginator = EstimatedCountPaginator(Run.objects.order_by("-created_at"), 2)
    # The planner never estimates fewer than one row, whatever its statistics of the table say.
    paginator.exact_up_to = 0

    with django_assert_num_queries(1) as queries:  # EXPLAIN, never SELECT count(*)
        count = paginator.count

    assert paginator.estimated and count >= 1
    assert queries.captured_queries[0]["sql"].startswith("EXPLAIN")


def test_the_paginator_offers_no_page_deeper_than_its_limit(tenant):
    for _ in range(5):
        make_run(tenant)
    paginator = EstimatedCountPaginator(Run.objects.order_by("-created_at"), 1)
    paginator.max_pages = 3

    assert paginator.count == 5 and paginator.num_pages == 3
    assert list(paginator.page_range) == [1, 2, 3]


def test_the_paginator_counts_small_results_exactly(tenant):
    runs = [make_run(tenant) for _ in range(3)]
    paginator = EstimatedCountPaginator(
        Run.objects.filter(pk__in=[r.pk for r in runs[:2]]).order_by("pk"), 50
    )

    assert (paginator.count, paginator.estimated) == (2, False)


# A run's page


def test_run_page_shows_escaped_json_steps_and_events_in_a_fixed_number_of_queries(
    operator_client, tenant, django_assert_num_queries
):
    run = make_run(
        tenant,
        "failed",
        error_kind="fatal",
        error="the <CRM> said no",
        result={"partial": "<i>x</i>"},
    )
    add_steps(run, 3)
    url = f"{CHANGELIST}{run.pk}/change/"
    operator_client.get(
        url
    )  # the first visit of a process also loads the run's ContentType (then cached)
    # session, user, permissions (2), the run with its tenant, the steps, the events (the latest 200).
    with django_assert_num_queries(7):
        response = operator_client.get(url)

    html = response.content.decode()
    assert response.status_code == 200
    assert "&lt;b&gt;untrusted&lt;/b&gt;" in html and "<b>untrusted</b>" not in html
    assert "&lt;i&gt;x&lt;/i&gt;" in html
    assert "step 3" in html and ">300<" in html  # the steps inline, with their tokens
    assert "run.queued" in html  # the events inline (the submit wrote the first)
    assert 'name="_save"' not in html  # read-only: people act through the actions
    assert 'value="retry_runs"' in html  # the actions are on the run's own page too


def test_an_action_from_the_run_page_comes_back_to_it(operator_client, operator, tenant):
    run = make_run(tenant, "queued")
    url = f"{CHANGELIST}{run.pk}/change/"

    confirmation = operator_client.post(
        url, {"CHANGE_FORM-action": "cancel_runs", "_selected_action": str(run.pk)}
    )
    assert b'name="CHANGE_FORM-action" value="cancel_runs"' in confirmation.content
    assert fresh(run).status == "queued"

    response = operator_client.post(
        url, {"CHANGE_FORM-action": "cancel_runs", "_selected_action": str(run.pk), "apply": "1"}
    )

    assert response.status_code == 302 and response["Location"] == url
    assert fresh(run).status == "cancelled"
    assert (last_event(run).actor_type, last_event(run).actor_id) == ("user", str(operator.pk))


def test_retry_from_step_from_the_run_page_goes_through_its_form(operator_client, tenant):
    run = make_run(tenant, "failed", error_kind="fatal")
    add_steps(run, 2)
    url = f"{CHANGELIST}{run.pk}/change/"

    form = operator_client.post(
        url, {"CHANGE_FORM-action": "retry_from_step", "_selected_action": str(run.pk)}
    )
    assert b'name="CHANGE_FORM-action" value="retry_from_step"' in form.content

    operator_client.post(
        url,
        {
            "CHANGE_FORM-action": "retry_from_step",
            "_selected_action": str(run.pk),
            "apply": "1",
            "from_step": "2",
        },
    )
    assert (fresh(run).status, fresh(run).generation) == ("queued", 2)


def test_a_run_page_says_what_the_run_waits_for(operator_client, tenant):
    from tests.support.admin_helpers import waiting_on

    run, _ = waiting_on(tenant, kind="approval")

    html = operator_client.get(f"{CHANGELIST}{run.pk}/change/").content.decode()

    assert "&quot;type&quot;: &quot;approval&quot;" in html


# The overview


def test_overview_shows_depth_capacity_throughput_stuck_runs_and_workers(
    operator_client, tenant, busy, django_assert_num_queries
):
    Worker.objects.create(host="alive-host", pid=1, concurrency=4, runs_held=2, queues=["default"])
    Worker.objects.create(
        host="dead-host", pid=2, concurrency=4, last_seen_at=timezone.now() - timedelta(hours=1)
    )
    stuck = [r for r in busy if r.locked_until and r.locked_until < timezone.now()][0]
    Tenant.objects.filter(pk=tenant.pk).update(running=1, queued=3)  # the claim keeps these
    # session, user, permissions (2); queues: depth, oldest, paused queues, paused kinds;
    # tenants: one; throughput: one; stuck: the list and its count; workers: live and lost.
    operator_client.get(OVERVIEW)
    with django_assert_num_queries(14):
        response = operator_client.get(OVERVIEW)

    html = response.content.decode()
    assert response.status_code == 200
    assert 'hx-get="/admin/runs/run/overview/?panel=queues"' in html
    assert "Last hour: 6 finished, 3 failed (50.0 %)" in html
    assert f"/admin/runs/run/{stuck.pk}/change/" in html and "Stuck runs (lease expired): 1" in html
    assert "alive-host" in html and "dead-host" not in html and "1 went silent today" in html
    assert f"{tenant.slug}</a>" in html and f"1 / {tenant.max_running}" in html


def test_overview_panels_refresh_alone(operator_client, busy, django_assert_num_queries):
    # session, user, permissions (2), then only the stuck panel's two queries.
    with django_assert_num_queries(6):
        response = operator_client.get(f"{OVERVIEW}?panel=stuck", headers=HTMX)

    html = response.content.decode()
    assert html.lstrip().startswith('<section class="module" id="panel-stuck"')
    assert "<html" not in html


def test_the_admin_index_links_the_overview(operator_client):
    assert b'href="/admin/runs/run/overview/"' in operator_client.get("/admin/").content


# Tenants, keys, workers, queues, kinds


def test_tenant_list_shows_usage_now(admin_client, tenant):
    from runs.models import Tenant, TenantDailyCost

    Tenant.objects.filter(pk=tenant.pk).update(running=2, queued=7)
    TenantDailyCost.objects.create(tenant=tenant, day=timezone.now().date(), cost_cents="12.5")

    html = admin_client.get("/admin/runs/tenant/").content.decode()

    assert f"2 / {tenant.max_running}" in html and "7 / 1000" in html and "12.5" in html


def test_editing_a_tenants_limits_never_overwrites_its_live_counters(admin_client, tenant):
    from runs.models import Tenant

    page = admin_client.get(f"/admin/runs/tenant/{tenant.pk}/change/")
    assert page.status_code == 200
    Tenant.objects.filter(pk=tenant.pk).update(running=4, queued=9)  # claims meanwhile

    admin_client.post(
        f"/admin/runs/tenant/{tenant.pk}/change/",
        {
            "name": tenant.name,
            "slug": tenant.slug,
            "max_running": 9,
            "max_queued": 1000,
            "weight": 2,
            "default_cost_ceiling_cents": "",
            "daily_cost_cap_cents": "",
        },
    )

    tenant.refresh_from_db()
    assert (tenant.max_running, tenant.weight, tenant.running, tenant.queued) == (9, 2, 4, 9)


def test_tenants_pause_and_resume(admin_client, tenant):
    admin_client.post(
        "/admin/runs/tenant/", {"action": "pause_tenants", "_selected_action": [tenant.pk]}
    )
    assert fresh_tenant(tenant).paused is True
    admin_client.post(
        "/admin/runs/tenant/", {"action": "resume_tenants", "_selected_action": [tenant.pk]}
    )
    assert fresh_tenant(tenant).paused is False


def fresh_tenant(tenant):
    tenant.refresh_from_db()
    return tenant


def test_adding_an_api_key_shows_the_secret_once_and_stores_its_hash(admin_client, tenant):
    from runs.keys import authenticate_key, hash_key
    from runs.models import ApiKey

    response = admin_client.post(
        "/admin/runs/apikey/add/",
        {
            "tenant": tenant.pk,
            "name": "billing",
            "scopes": ["runs:read", "runs:write"],
        },
    )

    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    secret = response.content.decode().split('id="api-key-secret"')[1].split(">")[1].split("<")[0]
    key = ApiKey.objects.get(name="billing")
    assert secret.startswith(f"ak_{key.prefix}_")
    assert key.secret_sha256 == hash_key(secret) and key.scopes == ["runs:read", "runs:write"]
    assert authenticate_key(secret) == key
    assert secret.encode() not in admin_client.get(f"/admin/runs/apikey/{key.pk}/change/").content
    assert secret.encode() not in admin_client.get("/admin/runs/apikey/").content


def test_revoking_a_key_stops_it_at_once(admin_client, tenant):
    from runs.keys import authenticate_key, create_api_key

    issued = create_api_key(tenant=tenant, name="old")

    admin_client.post(
        "/admin/runs/apikey/", {"action": "revoke", "_selected_action": [issued.api_key.pk]}
    )

    issued.api_key.refresh_from_db()
    assert issued.api_key.revoked_at is not None
    assert authenticate_key(issued.secret) is None


def test_worker_list_tells_alive_from_dead(admin_client):
    Worker.objects.create(host="alive-host", pid=1, concurrency=4, runs_held=3)
    Worker.objects.create(
        host="dead-host", pid=2, concurrency=4, last_seen_at=timezone.now() - timedelta(hours=1)
    )
    Worker.objects.create(host="gone-host", pid=3, concurrency=4, stopped_at=timezone.now())

    alive = admin_client.get("/admin/runs/worker/?state=alive").content.decode()
    dead = admin_client.get("/admin/runs/worker/?state=dead").content.decode()

    assert "alive-host" in alive and "dead-host" not in alive and "gone-host" not in alive
    assert "dead (silent 3600 s)" in dead or "dead (silent 3599 s)" in dead
    assert "stopped" in dead


def test_queues_are_paused_and_resumed_through_the_service(admin_client):
    from runs.models import Queue

    admin_client.post("/admin/runs/queue/add/", {"name": "long", "paused": "on"})
    queue = Queue.objects.get(name="long")
    assert queue.paused and queue.paused_at is not None

    admin_client.post("/admin/runs/queue/", {"action": "resume", "_selected_action": ["long"]})
    queue.refresh_from_db()
    assert (queue.paused, queue.paused_at) == (False, None)
    assert (
        b"lowercase letters"
        in admin_client.post("/admin/runs/queue/add/", {"name": "Bad Name"}).content
    )


def test_kinds_are_paused_from_the_registered_kinds(admin_client):
    from runs.models import KindState

    form = admin_client.get("/admin/runs/kindstate/add/").content.decode()
    assert '<option value="noop3">' in form

    admin_client.post("/admin/runs/kindstate/add/", {"name": "noop3", "paused": "on"})
    assert KindState.objects.get(name="noop3").paused

    admin_client.post("/admin/runs/kindstate/", {"action": "resume", "_selected_action": ["noop3"]})
    assert not KindState.objects.get(name="noop3").paused


@pytest.mark.parametrize(
    "path", ["/admin/runs/step/", "/admin/runs/membership/", "/admin/runs/apikey/add/"]
)
def test_the_other_pages_render(admin_client, tenant, path):
    add_steps(make_run(tenant, "done"), 2)

    assert admin_client.get(path).status_code == 200


def test_a_step_page_shows_its_input_and_output(admin_client, tenant):
    step = add_steps(make_run(tenant, "done"), 1)[0]

    html = admin_client.get(f"/admin/runs/step/{step.pk}/change/").content.decode()

    assert "&quot;seq&quot;: 1" in html and f"/admin/runs/run/{step.run_id}/change/" in html
