"""OpenAI Agents SDK agents on the durable runner: model and tool calls are steps, replayed, approved by people.

The SDK talks to the loopback fake OpenAI server (tests/support/fake_openai.py) through its own Chat
Completions model, from real worker processes; the SDK's own test model (agents.testing) drives
the in-process cases.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from decimal import Decimal

import pytest
from agents.testing import ScriptedModel, assistant_message, function_call
from django.db.models import Sum
from django.test import Client
from django.utils import timezone

import examples.frameworks.openai_agents_example  # noqa: F401  (the built-in example kind)
import tests.support.agents_openai_agents  # noqa: F401  (registers the kinds in this process)
from runs.control import approve_run, reject_run
from runs.models import Run, Step
from runs.services import Actor, submit_run
from tests.conftest import fresh
from tests.support.agents_openai_agents import SCRIPTS, executions
from tests.support.factories import MembershipFactory
from tests.support.fake_openai import PRICES, drive, fail, hang, say, turn
from tests.support.waiting import wait_until

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures
pytestmark = pytest.mark.django_db(transaction=True)

PERSON = Actor(type="user", id="42")
MODULES = (
    os.environ.get("AGENT_MODULES", "tests.support.agents") + ",tests.support.agents_openai_agents"
)
CENTS_PER_TOKEN_IN = Decimal(PRICES["fake-model"]["input"]) / 10_000
CENTS_PER_TOKEN_OUT = Decimal(PRICES["fake-model"]["output"]) / 10_000


def steps_of(run: Run) -> list[tuple[str, str, str]]:
    return [(s.name, s.kind, s.status) for s in Step.objects.filter(run=run).order_by("seq")]


def worker(processes, fake_llm, *args: str):
    """A worker process on the fake server that exits once nothing is claimable; fails the test if it does not."""
    proc = processes.worker("--burst", *args, AGENT_MODULES=MODULES, **fake_llm.env)
    assert proc.wait(60) == 0, processes.output(proc)
    return proc


def cost_of(usage: list[tuple[int, int]]) -> Decimal:
    return sum((i * CENTS_PER_TOKEN_IN + o * CENTS_PER_TOKEN_OUT for i, o in usage), Decimal(0))


def last_tool_message(body: dict) -> dict:
    return [m for m in body["messages"] if m["role"] == "tool"][-1]


# Model calls and tool calls are steps.


def test_every_model_call_and_tool_call_is_a_step_and_the_run_costs_their_sum(
    tenant, processes, fake_llm, tmp_path
):
    log = str(tmp_path / "tools.log")

    def brain(body):
        n = turn(body["messages"])
        return say(None, ("tick", {"i": n})) if n < 3 else say("finished after 3 model calls")

    fake_llm.brain = brain
    run = submit_run(tenant=tenant, kind="sdk_tools", input={"prompt": "count", "log": log})
    worker(processes, fake_llm)

    run = fresh(run)
    assert run.status == "done", run.error
    assert run.result == {"final_output": "finished after 3 model calls", "last_agent": "Counter"}
    assert steps_of(run) == [
        ("Thinking (iteration 1)", "llm", "done"),
        ("Calling tick", "tool", "done"),
        ("Thinking (iteration 2)", "llm", "done"),
        ("Calling tick", "tool", "done"),
        ("Thinking (iteration 3)", "llm", "done"),
    ]
    assert executions(log) == ["tick 1", "tick 2"]
    # The model was told each tool's result, through the SDK's Chat Completions model.
    bodies = fake_llm.bodies()
    assert fake_llm.count == 3
    assert last_tool_message(bodies[1])["content"] == "tick 1 done"
    assert [t["function"]["name"] for t in bodies[0]["tools"]] == ["tick", "refund"]

    # Each model step carries the tokens the provider reported and their price; the run costs their sum.
    llm = Step.objects.filter(run=run, kind="llm").order_by("seq")
    assert [(s.tokens_in, s.tokens_out) for s in llm] == fake_llm.usage
    assert [s.cost_cents for s in llm] == [cost_of([u]) for u in fake_llm.usage]
    assert all(s.cost_cents > 0 for s in llm)
    total = Step.objects.filter(run=run).aggregate(c=Sum("cost_cents"))["c"]
    assert run.cost_cents == total == cost_of(fake_llm.usage)
    # A model step shows its answer as the assistant message it added, with the tool call.
    first = llm[0]
    assert first.output["role"] == "assistant"
    assert first.output["tool_calls"][0]["function"] == {"name": "tick", "arguments": '{"i": 1}'}
    assert first.input["kwargs"]["request"]["model"] == "fake-model"
    tool = Step.objects.get(run=run, seq=2)
    assert tool.input["kwargs"]["call"]["arguments"] == {"i": 1}
    assert tool.output == {"content": "tick 1 done"}


MODEL_CALLS = 6
HELD = 4  # the fake server holds the 4th model call; the worker is killed meanwhile


def test_a_worker_killed_after_the_third_model_call_resumes_with_the_remaining_calls_only(
    tenant, processes, fake_llm, tmp_path
):
    log = str(tmp_path / "tools.log")
    held, release = threading.Event(), threading.Event()

    def brain(body):
        n = turn(body["messages"])
        if n == HELD and not held.is_set():
            held.set()
            release.wait(30)
            return fail(
                503, "the worker that asked is gone"
            )  # answered to nobody, and charged nothing
        if n == MODEL_CALLS:
            return say(f"finished after {n} model calls")
        return say(None, ("tick", {"i": n}))

    fake_llm.brain = brain
    run = submit_run(tenant=tenant, kind="sdk_tools", input={"prompt": "count", "log": log})
    first = processes.worker(
        "--lease", "3", "--heartbeat", "1", "--poll", "0.2", AGENT_MODULES=MODULES, **fake_llm.env
    )
    wait_until(held.is_set, what="the 4th model call")
    assert Step.objects.filter(run=run, kind="llm", status="done").count() == 3
    assert executions(log) == ["tick 1", "tick 2", "tick 3"]

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    release.set()
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once", AGENT_MODULES=MODULES)
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr

    worker(processes, fake_llm)
    run = fresh(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["final_output"] == f"finished after {MODEL_CALLS} model calls"
    # Calls 1-3 were made once, by the first worker; the second made calls 4-6 only.
    bodies = fake_llm.bodies()
    assert [turn(b["messages"]) for b in bodies] == [1, 2, 3, 4, 4, 5, 6]
    # It sent the 4th call the same conversation, rebuilt from the step log.
    assert bodies[4] == bodies[3]
    model_steps = Step.objects.filter(run=run, kind="llm")
    assert model_steps.count() == MODEL_CALLS
    assert set(Step.objects.filter(run=run).values_list("executions", flat=True)) == {1}
    assert executions(log) == [f"tick {i}" for i in range(1, MODEL_CALLS)]
    assert run.cost_cents == cost_of(fake_llm.usage)  # the lost call was not charged


def test_a_failed_model_call_is_retried_by_the_engine_and_a_refused_request_fails_the_run(
    tenant, fake_llm, tmp_path
):
    fake_llm.enqueue(fail(503, "overloaded"), say("second time lucky"))
    run = submit_run(
        tenant=tenant, kind="sdk_tools", input={"prompt": "hi", "log": str(tmp_path / "tools.log")}
    )
    [run] = drive(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["final_output"] == "second time lucky"
    # The SDK's client did not retry by itself: the engine did, once.
    assert fake_llm.count == 2
    [step] = Step.objects.filter(run=run)
    assert (step.kind, step.executions) == ("llm", 2)

    fake_llm.enqueue(fail(400, "bad request"))
    run = submit_run(
        tenant=tenant, kind="sdk_tools", input={"prompt": "hi", "log": str(tmp_path / "tools.log")}
    )
    [run] = drive(run)
    assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1)
    assert "bad request" in run.error


def test_a_model_call_that_hangs_times_out_and_is_made_again(tenant, fake_llm, tmp_path):
    fake_llm.enqueue(hang(30), say("answered in time"))
    run = submit_run(
        tenant=tenant,
        kind="sdk_tools_short_timeout",
        input={"prompt": "hi", "log": str(tmp_path / "tools.log")},
    )
    started = time.monotonic()
    [run] = drive(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["final_output"] == "answered in time"
    assert (
        time.monotonic() - started < 15
    )  # the hung call was given up after its timeout, not waited out
    [step] = Step.objects.filter(run=run)
    assert (step.kind, step.executions) == ("llm", 2)


# needs_approval tools wait for a person.


def approval_brain(body):
    if turn(body["messages"]) == 1:
        return say("I will refund it.", ("refund", {"order_id": "A-7", "amount_cents": 500}))
    return say(f"told: {last_tool_message(body)['content']}")


def until_approval(tenant, processes, fake_llm, log):
    fake_llm.brain = approval_brain
    run = submit_run(tenant=tenant, kind="sdk_tools", input={"prompt": "refund A-7", "log": log})
    worker(processes, fake_llm)
    run = fresh(run)
    assert run.status == "waiting_human", run.error
    assert steps_of(run) == [
        ("Thinking (iteration 1)", "llm", "done"),
        ("Approve refund", "approval", "waiting"),
    ]
    proposal = Step.objects.get(run=run, kind="approval").input["proposal"]
    assert proposal["summary"] == "Call refund"
    assert proposal["arguments"] == {"order_id": "A-7", "amount_cents": 500}
    assert proposal["changes"] == [
        {"field": "order_id", "after": "A-7"},
        {"field": "amount_cents", "after": 500},
    ]
    assert executions(log) == [] and fake_llm.count == 1
    return run


def test_an_approved_tool_call_runs_once_and_the_run_continues(
    tenant, processes, fake_llm, tmp_path
):
    log = str(tmp_path / "tools.log")
    run = until_approval(tenant, processes, fake_llm, log)

    approve_run(run=run, actor=PERSON, comment="fine")
    worker(processes, fake_llm)
    run = fresh(run)
    assert run.status == "done", run.error
    assert executions(log) == ["refund A-7 500"]
    assert run.result["final_output"] == 'told: {"refunded": 500, "order_id": "A-7"}'
    assert steps_of(run) == [
        ("Thinking (iteration 1)", "llm", "done"),
        ("Approve refund", "approval", "done"),
        ("Calling refund", "tool", "done"),
        ("Thinking (iteration 2)", "llm", "done"),
    ]
    # The replay after the decision made no model call again.
    assert fake_llm.count == 2


def test_a_rejected_tool_call_never_runs_and_the_model_is_told(
    tenant, processes, fake_llm, tmp_path
):
    log = str(tmp_path / "tools.log")
    run = until_approval(tenant, processes, fake_llm, log)

    reject_run(run=run, actor=PERSON, comment="too much for a scratch")
    worker(processes, fake_llm)
    run = fresh(run)
    assert run.status == "done", run.error
    assert executions(log) == []
    told = last_tool_message(fake_llm.bodies()[1])["content"]
    assert "rejected this call: too much for a scratch" in told
    assert run.result["final_output"] == f"told: {told}"
    assert steps_of(run) == [
        ("Thinking (iteration 1)", "llm", "done"),
        ("Approve refund", "approval", "done"),
        ("Thinking (iteration 2)", "llm", "done"),
    ]


# The SDK's own test model, in process.


def scripted(name: str, **models: ScriptedModel) -> str:
    SCRIPTS[name] = models
    return name


def test_a_failed_tool_call_is_retried_without_calling_the_model_or_the_earlier_tools_again(
    tenant, tmp_path
):
    log = str(tmp_path / "tools.log")
    model = ScriptedModel(
        [
            [
                function_call("tick", {"i": 1}, call_id="c1"),
                function_call("flaky", {}, call_id="c2"),
                function_call("tick", {"i": 2}, call_id="c3"),
            ],
            [assistant_message("all three done")],
        ]
    )
    run = submit_run(
        tenant=tenant,
        kind="sdk_scripted",
        input={
            "script": scripted("retry", model=model),
            "log": log,
            "flaky_marker": str(tmp_path / "failed-once"),
        },
    )
    [run] = drive(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["final_output"] == "all three done"
    # The model was called twice in all: the second attempt replayed the first call.
    assert len(model.calls) == 2 and model.remaining_steps == 0
    # The calls of one turn ran one after another, in the model's order; only the failed one again.
    assert executions(log) == ["tick 1", "flaky", "flaky", "tick 2"]
    assert [(name, kind) for name, kind, _ in steps_of(run)] == [
        ("Thinking (iteration 1)", "llm"),
        ("Calling tick", "tool"),
        ("Calling flaky", "tool"),
        ("Calling tick", "tool"),
        ("Thinking (iteration 2)", "llm"),
    ]
    assert Step.objects.get(run=run, seq=3).executions == 2


def test_a_turn_with_an_ordinary_call_and_one_awaiting_approval_runs_each_tool_once(
    tenant, tmp_path
):
    log = str(tmp_path / "tools.log")
    model = ScriptedModel(
        [
            [
                function_call("tick", {"i": 1}, call_id="c1"),
                function_call("refund", {"order_id": "A-9", "amount_cents": 900}, call_id="c2"),
            ],
            [assistant_message("ticked and refunded")],
        ]
    )
    run = submit_run(
        tenant=tenant,
        kind="sdk_scripted",
        input={"script": scripted("mixed", model=model), "log": log},
    )
    [run] = drive(run)
    assert run.status == "waiting_human", run.error
    assert executions(log) == ["tick 1"]

    approve_run(run=run, actor=PERSON)
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["final_output"] == "ticked and refunded"
    assert executions(log) == ["tick 1", "refund A-9 900"]
    assert len(model.calls) == 2
    assert [(name, kind) for name, kind, _ in steps_of(run)] == [
        ("Thinking (iteration 1)", "llm"),
        ("Calling tick", "tool"),
        ("Approve refund", "approval"),
        ("Calling refund", "tool"),
        ("Thinking (iteration 2)", "llm"),
    ]


def test_running_out_of_turns_fails_the_run_as_a_step_limit(tenant, tmp_path):
    model = ScriptedModel([[function_call("tick", {"i": n}, call_id=f"c{n}")] for n in range(1, 4)])
    run = submit_run(
        tenant=tenant,
        kind="sdk_scripted",
        input={
            "script": scripted("turns", model=model),
            "log": str(tmp_path / "tools.log"),
            "max_turns": 2,
        },
    )
    [run] = drive(run)
    assert (run.status, run.error_kind) == ("failed", "step_limit")
    assert "max_turns" in run.error


def test_the_agents_handed_off_to_make_their_model_calls_as_steps_too(tenant, tmp_path):
    triage = ScriptedModel([[function_call("transfer_to_specialist", {}, call_id="h1")]])
    specialist = ScriptedModel(
        [[function_call("tick", {"i": 1}, call_id="c1")], [assistant_message("counted")]]
    )
    run = submit_run(
        tenant=tenant,
        kind="sdk_handoff",
        input={
            "script": scripted("handoff", triage=triage, specialist=specialist),
            "log": str(tmp_path / "tools.log"),
        },
    )
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result == {"final_output": "counted", "last_agent": "Specialist"}
    assert [(name, kind) for name, kind, _ in steps_of(run)] == [
        ("Thinking (iteration 1)", "llm"),
        ("Thinking (iteration 2)", "llm"),
        ("Calling tick", "tool"),
        ("Thinking (iteration 3)", "llm"),
    ]


# The built-in example kind.


def test_the_example_kind_runs_offline_through_its_approval_to_done(tenant, offline):
    run = submit_run(tenant=tenant, kind="openai_agents_demo", input={})
    [run] = drive(run)
    assert run.status == "waiting_human", run.error
    approval = Step.objects.get(run=run, kind="approval")
    assert approval.name == "Approve issue_refund"
    assert approval.input["proposal"]["arguments"]["amount_cents"] == 3499

    approve_run(run=run, actor=PERSON)
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["refund"]["status"] == "refunded"
    assert run.result["answer"].startswith("I refunded $34.99 for your Electric kettle")
    assert (run.outcome, run.summary) == ("succeeded", "Refunded 34.99 on order A-1001")
    assert Step.objects.filter(run=run, kind="llm").count() == 3
    assert run.cost_cents > 0
    # Its page shows the model calls as transcripts: the tool results the model read, and its answers.
    client = Client()
    client.force_login(MembershipFactory(tenant=tenant).user)
    page = client.get(f"/runs/{run.id}/").content.decode()
    assert "Result of lookup_order" in page and "Electric kettle" in page
    assert "I refunded $34.99 for your Electric kettle" in page


def test_the_example_kind_runs_offline_in_a_worker_process(tenant, processes):
    run = submit_run(
        tenant=tenant,
        kind="openai_agents_demo",
        input={"order_id": "A-1002", "message": "The lamp flickers."},
    )
    env = {
        "AGENT_MODULES": MODULES + ",examples.frameworks.openai_agents_example",
        "LLM_BASE_URL": "",
        "LLM_PROVIDER": "",
        "RUNS_DEMO_DELAY_SCALE": "0",
    }
    proc = processes.worker("--burst", **env)
    assert proc.wait(60) == 0, processes.output(proc)
    assert fresh(run).status == "waiting_human", fresh(run).error
    reject_run(run=run, actor=PERSON, comment="not for a flicker")
    proc = processes.worker("--burst", **env)
    assert proc.wait(60) == 0, processes.output(proc)
    run = fresh(run)
    assert (run.status, run.outcome) == ("done", "unchanged"), run.error
    assert run.result["refund"] is None
    assert "not for a flicker" in run.result["answer"]
    assert run.summary == "Nothing was refunded on order A-1002"
    assert (
        json.loads(Step.objects.get(run=run, name="Calling lookup_order").output["content"])["item"]
        == "Desk lamp"
    )


def test_the_example_kind_uses_the_configured_server_when_there_is_one(tenant, fake_llm):
    def brain(body):
        n = turn(body["messages"])
        if n == 1:
            return say(None, ("lookup_order", {"order_id": "A-1001"}))
        if n == 2:
            return say(
                None,
                ("issue_refund", {"order_id": "A-1001", "amount_cents": 3499, "reason": "broken"}),
            )
        return say("Refunded your kettle.")

    fake_llm.brain = brain
    run = submit_run(tenant=tenant, kind="openai_agents_demo", input={})
    [run] = drive(run)
    assert run.status == "waiting_human", run.error
    approve_run(run=run, actor=PERSON)
    [run] = drive(run)
    assert run.status == "done", run.error
    assert (run.result["answer"], run.result["model"]) == ("Refunded your kettle.", "fake-model")
    assert run.result["refund"]["amount_cents"] == 3499
    assert (
        json.loads(last_tool_message(fake_llm.bodies()[1])["content"])["item"] == "Electric kettle"
    )
    assert fake_llm.count == 3
    assert run.cost_cents == cost_of(fake_llm.usage)
