"""Which kinds a tenant may start (runs.kinds), and the example content kept out of deployments (issue 25).

A tenant starts only public ``@agent`` kinds its operator's list allows, through every door
(``POST /api/runs``, a fork, the dashboard's form); a refused kind is answered exactly as an unknown
one. The demo apps' tables are per tenant; without ``RUNS_EXAMPLES`` neither they nor the example kinds
exist, in real processes.
"""

from __future__ import annotations

import json
import os
import secrets

import httpx
import pytest
from django.test import Client

from examples.crm.models import Lead, LeadUpdate
from runs import submit_run
from runs.control import approve_run
from runs.keys import create_api_key
from runs.models import Event, Run, Tenant
from runs.services import Actor
from tests.conftest import ROOT, free_port
from tests.support import django_tasks  # noqa: F401  (its @task functions are kinds in this process)
from tests.support.factories import MembershipFactory, TenantFactory
from tests.support.fake_openai import drive
from tests.support.waiting import wait_until

pytest_plugins = ["tests.support.fake_openai"]  # the offline fixture

TASK = "tests.support.django_tasks.record"  # a Django @task: a function with the arguments its caller chooses
MODULES = os.environ.get("AGENT_MODULES", "tests.support.agents") + ",tests.support.django_tasks"
EXAMPLE_KINDS = {
    "research",
    "research_brief",
    "research_many",
    "crm_update",
    "deploy_app",
    "pydantic_ai_demo",
    "openai_agents_demo",
}


def post(client, path, body):
    return client.post(path, data=json.dumps(body), content_type="application/json")


def assert_refused_as_unknown(client, kind, input):
    """422 with the very answer of a kind nobody registered, and nothing written."""
    runs, events = Run.objects.count(), Event.objects.count()
    refused = post(client, "/api/runs", {"kind": kind, "input": input})
    unknown = post(client, "/api/runs", {"kind": "no_such_kind", "input": input})
    assert (refused.status_code, unknown.status_code) == (422, 422), refused.content
    assert refused.json() == json.loads(
        json.dumps(unknown.json()).replace("'no_such_kind'", repr(kind))
    )
    assert (Run.objects.count(), Event.objects.count()) == (runs, events)


@pytest.fixture
def hidden_kind():
    """A kind registered with public=False, in this process only."""
    from runs import registry

    registry.agent("trust_hidden", public=False)(lambda ctx, data: {"ran": True})
    yield "trust_hidden"
    registry._registry.pop("trust_hidden", None)


@pytest.mark.django_db(transaction=True)
def test_a_task_kind_posted_with_an_ordinary_key_is_an_unknown_kind_and_never_runs(
    api, processes, tmp_path
):
    ran = tmp_path / "ran"
    assert_refused_as_unknown(api, TASK, {"args": [str(ran), "by a tenant"], "kwargs": {}})
    worker = processes.worker(
        "--burst", "--poll", "0.1", AGENT_MODULES=MODULES
    )  # it knows the task
    assert worker.wait(60) == 0, processes.output(worker)
    assert not ran.exists() and not Run.objects.exists()


@pytest.mark.django_db
def test_api_kinds_lists_neither_task_kinds_nor_kinds_registered_as_not_public(api, request):
    names = {kind["name"] for kind in api.get("/api/kinds").json()}
    assert {"echo", "steps", "noop3"} <= names
    assert not {name for name in names if name.startswith("tests.support.django_tasks.")}
    hidden_kind = request.getfixturevalue("hidden_kind")
    assert hidden_kind not in {kind["name"] for kind in api.get("/api/kinds").json()}
    assert_refused_as_unknown(api, hidden_kind, {})


@pytest.mark.django_db
def test_the_new_run_form_offers_and_takes_only_startable_kinds(client, request):
    member = MembershipFactory()
    client.force_login(member.user)
    page = client.get("/runs/new/").content.decode()
    assert "?kind=echo" in page and "tests.support.django_tasks" not in page
    hidden_kind = request.getfixturevalue("hidden_kind")
    assert hidden_kind not in client.get("/runs/new/").content.decode()
    for kind in (TASK, hidden_kind):
        assert client.get(f"/runs/new/?kind={kind}").status_code == 404
        posted = client.post(f"/runs/new/?kind={kind}", {"input-input": "{}"})
        assert (
            posted.status_code == 404
            and f"There is no kind named “{kind}”" in posted.content.decode()
        )
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_allowkinds_narrows_a_tenant_idempotently_and_all_lifts_it(api, tenant, processes):
    narrowed = processes.run("allowkinds", tenant.slug, "echo,steps")
    assert narrowed.returncode == 0, narrowed.stderr
    assert narrowed.stdout.splitlines() == [
        f"tenant {tenant.slug}: only echo, steps",
        "it may start: echo, steps",
    ]
    assert processes.run("allowkinds", tenant.slug, "echo,steps").stdout == narrowed.stdout
    assert Tenant.objects.get(pk=tenant.pk).allowed_kinds == ["echo", "steps"]

    assert [kind["name"] for kind in api.get("/api/kinds").json()] == ["echo", "steps"]
    assert_refused_as_unknown(api, "noop3", {})
    assert post(api, "/api/runs", {"kind": "echo", "input": {"text": "hi"}}).status_code == 202
    other = Client(
        headers={
            "Authorization": f"Bearer {create_api_key(tenant=TenantFactory(), name='b').secret}"
        }
    )
    assert (
        post(other, "/api/runs", {"kind": "noop3", "input": {}}).status_code == 202
    )  # its own tenant only

    lifted = processes.run("allowkinds", tenant.slug, "--all")
    assert lifted.returncode == 0, lifted.stderr
    assert lifted.stdout.splitlines()[0] == f"tenant {tenant.slug}: every kind (no list)"
    assert "noop3" in lifted.stdout and TASK not in lifted.stdout
    assert post(api, "/api/runs", {"kind": "noop3", "input": {}}).status_code == 202

    for args in (
        (tenant.slug, TASK),
        (tenant.slug, "no_such_kind"),
        (tenant.slug,),
        ("no-such-tenant", "--all"),
    ):
        failed = processes.run("allowkinds", *args, AGENT_MODULES=MODULES)
        assert failed.returncode == 1 and failed.stderr.startswith("CommandError: "), (
            args,
            failed.stderr,
        )
    assert Tenant.objects.get(pk=tenant.pk).allowed_kinds is None


@pytest.mark.django_db
def test_the_admin_edits_a_tenants_kinds(admin_client, tenant):
    def save(kinds):
        return admin_client.post(
            f"/admin/runs/tenant/{tenant.pk}/change/",
            {
                "name": tenant.name,
                "slug": tenant.slug,
                "max_running": 3,
                "max_queued": 1000,
                "weight": 1,
                "default_cost_ceiling_cents": "",
                "daily_cost_cap_cents": "",
                "allowed_kinds": kinds,
            },
        )

    assert save("echo, steps").status_code == 302
    assert Tenant.objects.get(pk=tenant.pk).allowed_kinds == ["echo", "steps"]
    refused = save(f"echo, {TASK}")
    assert (
        refused.status_code == 200
        and "Not a kind a tenant can start: tests.support.django_tasks.record"
        in refused.content.decode()
    )
    assert save("").status_code == 302 and Tenant.objects.get(pk=tenant.pk).allowed_kinds is None


@pytest.mark.django_db
def test_a_fork_starts_only_a_kind_the_tenant_may_start(api, tenant):
    task_run = submit_run(
        tenant=tenant, kind="tests.support.django_tasks.add", input={"args": [1, 2]}
    )  # code may
    steps_run = submit_run(tenant=tenant, kind="steps", input={"steps": 1})
    for run in (
        task_run,
        steps_run,
    ):  # a task kind never; steps once the tenant is narrowed to echo
        if run is steps_run:
            Tenant.objects.filter(pk=tenant.pk).update(allowed_kinds=["echo"])
        before = Run.objects.count(), Event.objects.count()
        refused = post(api, f"/api/runs/{run.pk}/fork", {"from_step": 1})
        assert refused.status_code == 422 and refused.json() == {
            "detail": f"unknown kind {run.kind!r}; GET /api/kinds lists the kinds you may start"
        }
        assert (Run.objects.count(), Event.objects.count()) == before
    Tenant.objects.filter(pk=tenant.pk).update(allowed_kinds=None)
    assert post(api, f"/api/runs/{steps_run.pk}/fork", {"from_step": 1}).status_code == 202


# The demo CRM: one set of leads per tenant


@pytest.mark.django_db(transaction=True)
def test_two_tenants_running_crm_update_see_and_change_only_their_own_leads(offline):
    a, b = TenantFactory(), TenantFactory()
    ada_a = Lead.objects.create(
        tenant=a, name="Ada", company="A", email="ada@same.test", stage="proposal"
    )
    ada_b = Lead.objects.create(
        tenant=b, name="Ada", company="B", email="ada@same.test", stage="proposal"
    )
    instruction = "They signed the contract today"

    # A names B's lead: not found, nothing read or written.
    [probe] = drive(
        submit_run(
            tenant=a, kind="crm_update", input={"lead_id": ada_b.pk, "instruction": instruction}
        )
    )
    assert (probe.status, probe.outcome) == ("done", "unchanged")
    assert probe.summary == f"Lead {ada_b.pk} was not found: nothing was written"
    assert "Company B" not in json.dumps(probe.result) and ada_b.email not in json.dumps(
        probe.result
    )

    # A changes its own lead; B's, with the same email, stays as it was.
    [run] = drive(
        submit_run(
            tenant=a, kind="crm_update", input={"lead_id": ada_a.pk, "instruction": instruction}
        )
    )
    approve_run(run=run, actor=Actor(type="user", id="1"))
    [run] = drive(run)
    assert run.summary.startswith("Moved Ada (A) to won")
    assert Lead.objects.get(pk=ada_a.pk).stage == "won"
    assert (
        Lead.objects.get(pk=ada_b.pk).stage == "proposal"
        and not LeadUpdate.objects.filter(lead=ada_b).exists()
    )


@pytest.mark.django_db(transaction=True)
def test_a_deploy_makes_its_resources_in_its_own_tenant(offline):
    from examples.deploys.models import Resource

    tenant = TenantFactory()
    [run] = drive(submit_run(tenant=tenant, kind="deploy_app", input={"app": "shop"}))
    assert run.status == "done", run.error
    assert set(Resource.objects.filter(run_id=run.pk).values_list("tenant_id", flat=True)) == {
        tenant.pk
    }


# Without RUNS_EXAMPLES (production): real processes


@pytest.mark.django_db(transaction=True)
def test_without_runs_examples_the_demo_apps_and_example_kinds_are_not_there(processes, tenant):
    listed = processes.run(
        "shell",
        "-c",
        (
            "import json; from django.apps import apps; from runs.registry import all_kinds; "
            "print(json.dumps({'apps': [a.label for a in apps.get_app_configs()], "
            "'kinds': [k.name for k in all_kinds()]}))"
        ),
        RUNS_EXAMPLES="0",
    )
    assert listed.returncode == 0, listed.stderr
    found = json.loads(listed.stdout.strip().splitlines()[-1])
    assert "runs" in found["apps"] and not {"crm", "deploys", "examples"} & set(found["apps"])
    assert "echo" in found["kinds"] and not EXAMPLE_KINDS & set(found["kinds"])
    assert not [kind for kind in found["kinds"] if "crm" in kind]

    port = free_port()
    processes.manage("serve", f"127.0.0.1:{port}", RUNS_EXAMPLES="0")
    base = f"http://127.0.0.1:{port}/api"
    wait_until(lambda: _answers(f"{base}/health"), timeout=30, what="the web server")
    headers = {"Authorization": f"Bearer {create_api_key(tenant=tenant, name='prod').secret}"}
    names = {kind["name"] for kind in httpx.get(f"{base}/kinds", headers=headers).json()}
    assert "echo" in names and not EXAMPLE_KINDS & names
    refused = httpx.post(
        f"{base}/runs", headers=headers, json={"kind": "research_brief", "input": {"topic": "x"}}
    )
    assert refused.status_code == 422 and refused.json()["detail"].startswith(
        "unknown kind 'research_brief'"
    )


def test_check_deploy_warns_when_the_examples_are_on_with_debug_off(processes):
    deploy = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "agents.example.com",
        "DEBUG": "0",
    }
    on = processes.run("check", "--deploy", RUNS_EXAMPLES="1", **deploy)
    assert "runs.W201" in on.stderr and "RUNS_EXAMPLES" in on.stderr, on.stderr
    off = processes.run("check", "--deploy", RUNS_EXAMPLES="0", **deploy)
    assert off.returncode == 0 and "runs.W201" not in off.stdout + off.stderr


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_example_package_is_not_part_of_the_engine():
    engine = [path for top in ("runs", "workers", "config") for path in (ROOT / top).rglob("*.py")]
    importing = [
        str(path)
        for path in engine
        if "import examples" in path.read_text() or "from examples" in path.read_text()
    ]
    assert importing == []
