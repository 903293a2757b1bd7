"""The built-in LLM kinds, research and crm_update: offline (scripted model) and against the fake provider."""

from __future__ import annotations

import json
import signal
import socket
import urllib.request

import pytest

from examples.crm.agents import crm_script
from examples.crm.models import Lead, LeadUpdate
from examples.crm.services import apply_lead_update
from runs.control import approve_run, reject_run
from runs.models import Step, Tenant
from runs.selectors import waiting_for
from runs.services import Actor, submit_run
from tests.conftest import fresh
from tests.support.factories import make_lead
from tests.support.fake_openai import MODEL, drive, from_script
from tests.support.waiting import wait_until
from workers.llm.scripts import research_script

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures
pytestmark = pytest.mark.django_db(transaction=True)

PERSON = Actor(type="user", id="42")
QUESTION = "How does a worker avoid running a step twice after a crash?"


def tool_names(run):
    return list(
        Step.objects.filter(run=run, kind="tool").order_by("seq").values_list("name", flat=True)
    )


def assert_cited_research(run):
    assert run.status == "done", run.error
    result = run.result
    assert result["plan"].startswith("Plan:")
    assert 1 <= len(result["citations"]) <= 2
    for citation in result["citations"]:
        assert f"[{citation['doc_id']}]" in result["answer"]
    assert {"checkpoints-and-replay", "idempotency-keys"} & {
        c["doc_id"] for c in result["citations"]
    }
    assert tool_names(run)[:2] == ["Calling search_docs", "Calling search_docs"]
    assert set(tool_names(run)[2:]) == {"Calling read_doc"}
    assert Step.objects.filter(run=run, kind="llm").count() == result["iterations"] == 3
    assert run.cost_cents > 0


def test_research_finishes_offline_with_citations(tenant, offline):
    run = submit_run(tenant=tenant, kind="research", input={"question": QUESTION, "max_sources": 2})
    [run] = drive(run)
    assert_cited_research(run)
    assert run.result["model"] == "scripted"


def test_research_finishes_against_the_provider(tenant, fake_llm):
    fake_llm.brain = from_script(research_script)
    run = submit_run(tenant=tenant, kind="research", input={"question": QUESTION, "max_sources": 2})
    [run] = drive(run)
    assert_cited_research(run)
    assert run.result["model"] == MODEL
    assert fake_llm.count == 3
    assert [t["function"]["name"] for t in fake_llm.bodies()[0]["tools"]] == [
        "search_docs",
        "read_doc",
    ]


def test_research_through_the_anthropic_adapter(tenant, fake_llm, settings):
    settings.LLM_PROVIDER = "anthropic"
    settings.LLM_BASE_URL = fake_llm.url.removesuffix("/v1")
    fake_llm.brain = from_script(research_script)
    run = submit_run(tenant=tenant, kind="research", input={"question": QUESTION, "max_sources": 2})
    [run] = drive(run)
    assert_cited_research(run)
    assert {r["path"] for r in fake_llm.requests} == {"/v1/messages"}
    last = fake_llm.bodies()[-1]
    assert last["system"].startswith("You are a careful research assistant")
    assert any(
        block["type"] == "tool_result"
        for turn in last["messages"]
        if isinstance(turn["content"], list)
        for block in turn["content"]
    )


def crm_run_until_approval(tenant, lead):
    run = submit_run(
        tenant=tenant,
        kind="crm_update",
        input={"lead_id": lead.pk, "instruction": "They signed the contract today"},
    )
    [run] = drive(run)
    assert run.status == "waiting_human", run.error
    pending = waiting_for(run)
    assert pending["type"] == "approval" and pending["name"] == "Approve update_lead"
    assert pending["proposal"]["arguments"] == {
        "lead_id": lead.pk,
        "stage": "won",
        "note": "They signed the contract today",
    }
    assert fresh_lead(lead).stage == "proposal"  # nothing written before the approval
    return run


def fresh_lead(lead):
    return Lead.objects.get(pk=lead.pk)


@pytest.mark.parametrize("provider", ["scripted", "openai"])
def test_crm_update_waits_for_approval_then_writes_once(tenant, provider, request):
    if provider == "openai":
        request.getfixturevalue("fake_llm").brain = from_script(crm_script)
    else:
        request.getfixturevalue("offline")
    lead = make_lead(tenant)
    run = crm_run_until_approval(tenant, lead)
    approve_run(run=run, actor=PERSON, comment="yes")
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["applied"] is True
    assert run.result["update"]["changes"] == {
        "stage": "won",
        "note": "They signed the contract today",
    }
    assert "proposal → won" in run.result["summary"]
    lead = fresh_lead(lead)
    assert lead.stage == "won" and lead.notes.endswith("They signed the contract today")
    update = LeadUpdate.objects.get(lead=lead)
    write = Step.objects.get(run=run, name="Calling update_lead")
    assert update.idempotency_key == write.idempotency_key == f"{run.pk}:1:{write.seq}"
    assert update.run_id == run.pk


def test_a_rejected_crm_update_is_not_written(tenant, offline):
    lead = make_lead(tenant)
    run = crm_run_until_approval(tenant, lead)
    reject_run(run=run, actor=PERSON, comment="not yet, wait for the countersignature")
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["applied"] is False
    assert "countersignature" in run.result["summary"]
    assert fresh_lead(lead).stage == "proposal"
    assert not LeadUpdate.objects.exists()
    assert "Calling update_lead" not in tool_names(run)


def test_crm_update_of_a_missing_lead_ends_with_an_explanation(tenant, offline):
    run = submit_run(
        tenant=tenant,
        kind="crm_update",
        input={"lead_id": 999999, "instruction": "They called back"},
    )
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["applied"] is False
    assert "there is no lead 999999" in run.result["summary"]


def test_the_crm_write_is_idempotent_per_key(tenant):
    lead = make_lead(tenant, stage="contacted")
    first = apply_lead_update(
        tenant_id=tenant.pk,
        lead_id=lead.pk,
        stage="qualified",
        note="budget confirmed",
        idempotency_key="k1",
    )
    again = apply_lead_update(
        tenant_id=tenant.pk, lead_id=lead.pk, stage="lost", note="other", idempotency_key="k1"
    )
    assert again.pk == first.pk
    lead = fresh_lead(lead)
    assert lead.stage == "qualified" and lead.notes.count("budget confirmed") == 1
    assert LeadUpdate.objects.count() == 1


def test_the_built_in_kinds_finish_offline_in_a_worker_process(tenant, processes):
    run = submit_run(
        tenant=tenant,
        kind="research",
        input={"question": "What happens to a run when its worker is killed?"},
    )
    worker = processes.worker(
        "--burst", LLM_BASE_URL="", LLM_PROVIDER="", RUNS_DEMO_DELAY_SCALE="0"
    )
    assert worker.wait(60) == 0, processes.output(worker)
    run = fresh(run)
    assert run.status == "done", run.error
    assert run.result["citations"] and run.result["model"] == "scripted"


def test_the_built_in_kinds_are_listed_with_their_input_schemas(api):
    kinds = {k["name"]: k for k in api.get("/api/kinds").json()}
    assert kinds["research"]["input_schema"]["required"] == ["question"]
    assert set(kinds["crm_update"]["input_schema"]["properties"]) == {"lead_id", "instruction"}
    assert kinds["research"]["description"].startswith(
        "Answer a question from the local document corpus"
    )


def call(method, url, key, body=None):
    request = urllib.request.Request(
        url, method=method, data=json.dumps(body).encode() if body else None
    )
    request.add_header("Content-Type", "application/json")
    request.add_header("Authorization", f"Bearer {key}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_make_run_offline_runs_both_built_in_kinds_to_the_end(processes):
    """`manage.py up` (what `make run` starts) with no provider: research answers, crm_update waits, then writes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    up = processes.manage(
        "up", f"127.0.0.1:{port}", LLM_BASE_URL="", LLM_PROVIDER="", RUNS_DEMO_DELAY_SCALE="0.01"
    )
    base = f"http://127.0.0.1:{port}/api"

    def printed_key():
        lines = processes.output(up).splitlines()
        found = [
            lines[i + 1].strip()
            for i, line in enumerate(lines[:-1])
            if line.startswith("API key for tenant")
        ]
        return found[-1] if found else None

    key = wait_until(printed_key, timeout=60, interval=0.2, what="the API key printed by `up`")
    wait_until(
        lambda: _answers(f"{base}/health"),
        timeout=60,
        interval=0.2,
        what="the web server of `up`",
    )
    lead = Lead.objects.create(
        tenant=Tenant.objects.get(slug="demo"),
        name="Ana Ruiz",
        company="Ruiz & Co",
        email="ana@ruiz.test",
        stage="qualified",
    )
    research = call(
        "POST",
        f"{base}/runs",
        key,
        {"kind": "research", "input": {"question": "How are retries delayed?"}},
    )
    crm = call(
        "POST",
        f"{base}/runs",
        key,
        {"kind": "crm_update", "input": {"lead_id": lead.pk, "instruction": "Sent them our offer"}},
    )
    wait_until(
        lambda: call("GET", f"{base}/runs/{crm['id']}", key)["status"] == "waiting_human",
        timeout=60,
        what="crm_update to ask for approval",
    )
    call("POST", f"{base}/runs/{crm['id']}/approve", key, {"comment": "go"})
    for run in (research, crm):
        wait_until(
            lambda run=run: call("GET", f"{base}/runs/{run['id']}", key)["status"] == "done",
            timeout=60,
            what=f"run {run['id']} to finish",
        )
    assert (
        "[retries-and-backoff]"
        in call("GET", f"{base}/runs/{research['id']}", key)["result"]["answer"]
    )
    assert Lead.objects.get(pk=lead.pk).stage == "proposal"
    assert call("GET", f"{base}/runs/{research['id']}/artifacts", key) == []

    up.send_signal(signal.SIGINT)
    assert up.wait(60) == 0, processes.output(up)


def _answers(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False
