"""Pydantic AI agents with AgentRunsDurability: each model request and tool call is a checkpointed step.

Against the fake OpenAI-compatible server (a real HTTP server on loopback) in
real worker processes, and with Pydantic AI's own TestModel and FunctionModel.
"""

from __future__ import annotations

import json
import os
import signal
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

import examples.frameworks.pydantic_ai_example  # noqa: F401  (registers pydantic_ai_demo here)
import tests.support.agents_pydantic_ai as kinds
from runs.control import approve_run, reject_run
from runs.models import Step
from runs.services import Actor, submit_run
from tests.conftest import fresh
from tests.support.control_helpers import Person, act, get
from tests.support.fake_openai import drive, fail, hang, say, turn
from tests.support.waiting import wait_until

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures
pytestmark = pytest.mark.django_db(transaction=True)

MODULES = (
    os.environ.get("AGENT_MODULES", "tests.support.agents") + ",tests.support.agents_pydantic_ai"
)
PERSON = Actor(type="user", id="42")


def cents(tokens_in: int, tokens_out: int) -> Decimal:
    """What the fake model's prices (2 and 8 dollars per million tokens) make of a call."""
    return Decimal(tokens_in) * Decimal("0.0002") + Decimal(tokens_out) * Decimal("0.0008")


def steps(run) -> list[tuple[str, str]]:
    return list(Step.objects.filter(run=run).order_by("seq").values_list("kind", "name"))


def tool_messages(body: dict) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


def run_in_worker(processes, fake_llm, run):
    worker = processes.worker("--burst", AGENT_MODULES=MODULES, **fake_llm.env)
    assert worker.wait(60) == 0, processes.output(worker)
    return fresh(run)


def test_every_model_request_and_tool_call_is_a_step_with_its_tokens_and_cost(
    tenant, processes, fake_llm
):
    def brain(body):
        n = turn(body["messages"])
        return say(None, ("tick", {"i": n})) if n < 3 else say("ticked twice")

    fake_llm.brain = brain
    run = submit_run(tenant=tenant, kind="pai_openai", input={"prompt": "tick twice"})
    run = run_in_worker(processes, fake_llm, run)

    assert run.status == "done", run.error
    assert run.result["output"] == "ticked twice"
    assert steps(run) == [
        ("llm", "Thinking (iteration 1)"),
        ("tool", "Calling tick"),
        ("llm", "Thinking (iteration 2)"),
        ("tool", "Calling tick"),
        ("llm", "Thinking (iteration 3)"),
    ]
    assert fake_llm.count == 3
    # What the model was told came from the tool steps.
    assert [json.loads(c) for c in tool_messages(fake_llm.bodies()[2])] == [
        {"tick": 1},
        {"tick": 2},
    ]
    assert Step.objects.get(run=run, seq=2).input == {"kwargs": {"arguments": {"i": 1}}}
    model_steps = Step.objects.filter(run=run, kind="llm").order_by("seq")
    assert [(s.tokens_in, s.tokens_out) for s in model_steps] == fake_llm.usage
    assert [s.cost_cents for s in model_steps] == [cents(i, o) for i, o in fake_llm.usage]
    assert all(s.tokens_in > 0 and s.cost_cents > 0 for s in model_steps)
    assert run.cost_cents == Step.objects.filter(run=run).aggregate(c=Sum("cost_cents"))["c"]
    assert run.cost_cents == sum(cents(i, o) for i, o in fake_llm.usage)


MODEL_CALLS = 6
HOLD_AT = 4  # the fake server holds the 4th model request, and the worker is killed while it waits


def test_a_worker_killed_after_the_third_model_call_resumes_with_the_remaining_calls_only(
    tenant, processes, fake_llm
):
    held = []

    def brain(body):
        n = turn(body["messages"])
        if n == HOLD_AT and not held:
            held.append(n)
            return hang(120)
        if n == MODEL_CALLS:
            return say(f"finished after {n} model calls")
        return say(None, ("tick", {"i": n}))

    fake_llm.brain = brain
    run = submit_run(tenant=tenant, kind="pai_openai", input={"prompt": "count"})
    first = processes.worker(
        "--lease", "3", "--heartbeat", "1", "--poll", "0.2", AGENT_MODULES=MODULES, **fake_llm.env
    )
    wait_until(
        lambda: (
            fake_llm.count == HOLD_AT
            and fresh(run).current_step == f"Thinking (iteration {HOLD_AT})"
        ),
        what="the 4th model request, held by the server",
    )
    assert Step.objects.filter(run=run, kind="llm", status="done").count() == HOLD_AT - 1

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once", AGENT_MODULES=MODULES)
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr

    run = run_in_worker(processes, fake_llm, run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["output"] == f"finished after {MODEL_CALLS} model calls"
    model_steps = Step.objects.filter(run=run, kind="llm").order_by("seq")
    assert model_steps.count() == MODEL_CALLS
    # Every model call made once, and the one interrupted made again: nothing recorded was asked twice.
    assert fake_llm.count == MODEL_CALLS + 1
    assert [s.executions for s in model_steps[: HOLD_AT - 1]] == [1] * (HOLD_AT - 1)
    assert set(Step.objects.filter(run=run, kind="tool").values_list("executions", flat=True)) == {
        1
    }
    # The resumed worker sent the held request again, rebuilt from the step log alone.
    bodies = fake_llm.bodies()
    assert bodies[HOLD_AT] == bodies[HOLD_AT - 1]
    assert [json.loads(c) for c in tool_messages(bodies[HOLD_AT])] == [
        {"tick": i} for i in range(1, HOLD_AT)
    ]

    totals = Step.objects.filter(run=run).aggregate(
        i=Sum("tokens_in"), o=Sum("tokens_out"), c=Sum("cost_cents")
    )
    assert (totals["i"], totals["o"]) == (
        sum(i for i, _ in fake_llm.usage),
        sum(o for _, o in fake_llm.usage),
    )
    assert run.cost_cents == totals["c"] == sum(cents(i, o) for i, o in fake_llm.usage)


def approval_brain(path):
    def brain(body):
        if turn(body["messages"]) == 1:
            return say(None, ("record", {"note": "hello", "path": str(path)}))
        return say(f"done: {tool_messages(body)[-1]}")

    return brain


def test_a_tool_that_requires_approval_waits_for_a_person_and_runs_once_approved(
    tenant, processes, fake_llm, tmp_path
):
    path = tmp_path / "notes.txt"
    fake_llm.brain = approval_brain(path)
    run = submit_run(tenant=tenant, kind="pai_openai", input={"prompt": "note it"})
    run = run_in_worker(processes, fake_llm, run)

    assert run.status == "waiting_human", run.error
    ops = Person(tenant, "ops")
    waiting = get(ops.client, run)["waiting_for"]
    assert (waiting["type"], waiting["name"]) == ("approval", "Approve record")
    assert waiting["proposal"]["summary"] == "Call record"
    assert waiting["proposal"]["arguments"] == {"note": "hello", "path": str(path)}
    assert not path.exists()

    response = act(ops.client, run, "approve", {"comment": "fine"})
    assert response.status_code == 200, response.content
    run = run_in_worker(processes, fake_llm, run)

    assert run.status == "done", run.error
    assert kinds.written_lines(path) == ["hello"]
    assert run.result["output"] == "done: recorded hello"
    assert steps(run) == [
        ("llm", "Thinking (iteration 1)"),
        ("approval", "Approve record"),
        ("tool", "Calling record"),
        ("llm", "Thinking (iteration 2)"),
    ]
    assert Step.objects.get(run=run, name="Calling record").executions == 1
    assert fake_llm.count == 2  # the first model call was replayed, not made again


def test_a_rejected_tool_call_is_told_to_the_model_and_never_runs(
    tenant, processes, fake_llm, tmp_path
):
    path = tmp_path / "notes.txt"
    fake_llm.brain = approval_brain(path)
    run = submit_run(tenant=tenant, kind="pai_openai", input={"prompt": "note it"})
    assert run_in_worker(processes, fake_llm, run).status == "waiting_human"

    reject_run(run=run, actor=PERSON, comment="not now")
    run = run_in_worker(processes, fake_llm, run)

    assert run.status == "done", run.error
    assert not path.exists()
    told = tool_messages(fake_llm.bodies()[-1])[-1]
    assert told.endswith("rejected this call: not now. Do not retry it.")
    assert run.result["output"] == f"done: {told}"
    assert not Step.objects.filter(run=run, kind="tool").exists()


def test_pydantic_ais_test_model_drives_the_tools_as_steps(tenant):
    run = submit_run(tenant=tenant, kind="pai_test_model", input={})
    [run] = drive(run)

    assert run.status == "done", run.error
    assert json.loads(run.result["output"]) == {"add": 0, "shout": "A"}
    assert steps(run) == [
        ("llm", "Thinking (iteration 1)"),
        ("tool", "Calling add"),
        ("tool", "Calling shout"),
        ("llm", "Thinking (iteration 2)"),
    ]
    assert all(
        s.tokens_in > 0 and s.tokens_out > 0 for s in Step.objects.filter(run=run, kind="llm")
    )


def test_a_second_agent_run_continues_the_conversation_of_the_first(tenant):
    run = submit_run(tenant=tenant, kind="pai_two_turns", input={})
    [run] = drive(run)

    assert run.status == "done", run.error
    first, second = run.result["run_ids"]
    assert (first, second) == (f"{run.id}:1", f"{run.id}:2")  # replay-stable, one per agent run
    assert (
        run.result["new"] < run.result["all"]
    )  # the second run's new messages exclude the first's
    # Iterations are counted per run_agent(); TestModel answers the second prompt without tools.
    assert [name for kind, name in steps(run) if kind == "llm"] == [
        "Thinking (iteration 1)",
        "Thinking (iteration 2)",
        "Thinking (iteration 1)",
    ]


def test_one_worker_runs_several_agents_at_once_on_its_event_loop(tenant, processes, fake_llm):
    def brain(body):
        n = turn(body["messages"])
        prompt = body["messages"][1]["content"]
        return say(None, ("tick", {"i": n})) if n < 3 else say(f"{prompt}: done")

    fake_llm.brain = brain
    runs = [
        submit_run(tenant=tenant, kind="pai_openai", input={"prompt": f"run {i}"}) for i in range(4)
    ]
    worker = processes.worker(
        "--burst", "--concurrency", "4", AGENT_MODULES=MODULES, **fake_llm.env
    )
    assert worker.wait(60) == 0, processes.output(worker)

    for i, run in enumerate(runs):
        run = fresh(run)
        assert (run.status, run.result["output"]) == ("done", f"run {i}: done"), run.error
        assert [kind for kind, _ in steps(run)] == ["llm", "tool", "llm", "tool", "llm"]
    assert fake_llm.count == 12
    # Their model requests interleaved: the runs were in flight together, each with its own steps.
    order = [body["messages"][1]["content"] for body in fake_llm.bodies()]
    assert order != sorted(order)


def test_a_retried_run_replays_the_function_models_recorded_answer(tenant):
    kinds.MODEL_CALLS.clear()
    kinds.TOOL_CALLS.clear()
    run = submit_run(tenant=tenant, kind="pai_flaky", input={})
    [run] = drive(run)

    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["output"] == "the answer is 42"
    assert len(kinds.TOOL_CALLS) == 2  # failed once, then succeeded
    assert (
        len(kinds.MODEL_CALLS) == 2
    )  # the first answer was replayed on the retry, not asked again
    first, fetch, second = Step.objects.filter(run=run).order_by("seq")
    assert (first.name, first.executions, fetch.executions, second.executions) == (
        "Thinking (iteration 1)",
        1,
        2,
        1,
    )
    assert (
        run.cost_cents == first.cost_cents + second.cost_cents > 0
    )  # the offline model is priced as "scripted"


@pytest.mark.parametrize("how", ["run_sync", "run"])
def test_an_agent_run_directly_instead_of_with_run_agent_fails_the_run_at_once(tenant, how):
    kinds.MODEL_CALLS.clear()
    run = submit_run(tenant=tenant, kind="pai_direct", input={"how": how})
    [run] = drive(run)

    assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1)
    assert "workers.frameworks.pydantic_ai.run_agent(ctx, agent, ...)" in run.error
    assert "'pai_flaky'" in run.error
    # Refused before its first model request: nothing ran that a replay would run again.
    assert kinds.MODEL_CALLS == []
    assert not Step.objects.filter(run=run).exists()


def test_outside_a_run_the_agent_is_a_plain_agent_and_inside_a_step_the_step_records_it(tenant):
    # A script or a unit test of the agent: no run, nothing to record, it simply runs (no UserError).
    output = kinds.tested.run_sync("use your tools").output
    assert isinstance(output, str) and output
    # Inside a plain ctx.step of a kind, the step records what the agent returns.
    run = submit_run(tenant=tenant, kind="pai_in_a_step", input={})
    [run] = drive(run)
    assert run.status == "done", run.error
    [step] = Step.objects.filter(run=run)
    assert (step.name, step.kind, step.output) == ("ask the agent", "custom", run.result["output"])


def test_a_tool_with_a_side_effect_is_keyed_as_the_tool_metadata_asks(tenant):
    run = submit_run(tenant=tenant, kind="pai_charging", input={})
    [run] = drive(run)

    assert run.status == "done", run.error
    step = Step.objects.get(run=run, name="Calling charge")
    assert step.idempotency_key == f"{run.id}:1:2"
    assert run.result["output"] == f"charged with key {step.idempotency_key}"


def test_a_429_from_the_model_is_retried_by_the_engine_after_the_delay_asked(tenant, fake_llm):
    fake_llm.enqueue(fail(429, "slow down", retry_after="0.2"))
    fake_llm.brain = lambda body: say("hello")
    run = submit_run(tenant=tenant, kind="pai_openai", input={})
    [run] = drive(run)

    assert (run.status, run.attempt, run.result["output"]) == ("done", 2, "hello"), run.error
    assert fake_llm.count == 2  # one request per attempt: the SDK did not retry on its own
    [step] = Step.objects.filter(run=run, kind="llm")
    assert step.attempts.get().error_kind == "retryable"


def test_a_hung_model_request_times_out_as_a_retryable_step_and_is_made_again(
    tenant, fake_llm, settings
):
    settings.RUNS_BACKOFF_BASE_SECONDS = 0.01
    fake_llm.enqueue(hang(30))
    fake_llm.brain = lambda body: say("answered")
    run = submit_run(tenant=tenant, kind="pai_openai_short_timeout", input={})
    [run] = drive(run)

    assert (run.status, run.attempt, run.result["output"]) == ("done", 2, "answered"), run.error
    [step] = Step.objects.filter(run=run, kind="llm")
    attempt = step.attempts.get()
    assert attempt.error_kind == "retryable" and "StepTimeout" in attempt.error
    assert fake_llm.count == 2


def test_a_400_from_the_model_fails_the_run_at_once(tenant, fake_llm):
    fake_llm.enqueue(fail(400, "bad request"))
    run = submit_run(tenant=tenant, kind="pai_openai", input={})
    [run] = drive(run)

    assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1)
    assert "status_code: 400" in run.error
    assert fake_llm.count == 1


def test_the_built_in_example_runs_offline_to_done_once_the_refund_is_approved(tenant, offline):
    run = submit_run(
        tenant=tenant,
        kind="pydantic_ai_demo",
        input={"order_id": 7, "request": "It arrived broken"},
    )
    [run] = drive(run)
    assert run.status == "waiting_human", run.error
    approval = Step.objects.get(run=run, kind="approval", status="waiting")
    assert approval.name == "Approve refund_order"
    assert approval.input["proposal"]["arguments"]["reason"] == "It arrived broken"

    approve_run(run=run, actor=PERSON)
    [run] = drive(run)

    assert run.status == "done", run.error
    assert run.result["refunded"] is True and run.result["model"] == "scripted"
    assert run.result["answer"].startswith("I refunded")
    assert (run.outcome, run.summary) == ("succeeded", "Refunded order 7")
    assert [kind for kind, _ in steps(run)] == [
        "custom",
        "llm",
        "tool",
        "llm",
        "approval",
        "tool",
        "llm",
    ]
    assert run.cost_cents > 0


def test_the_example_tells_the_customer_when_the_refund_is_rejected(tenant, offline):
    run = submit_run(
        tenant=tenant,
        kind="pydantic_ai_demo",
        input={"order_id": 7, "request": "I changed my mind"},
    )
    [run] = drive(run)
    reject_run(run=run, actor=PERSON, comment="outside the return window")
    [run] = drive(run)

    assert run.status == "done", run.error
    assert run.result["refunded"] is False
    assert "outside the return window" in run.result["answer"]
    assert run.outcome == "unchanged"
    assert not Step.objects.filter(run=run, name="Calling refund_order").exists()
