"""The tool-calling loop against a real HTTP server speaking Chat Completions: errors, accounting, bounds."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from django.db.models import Sum

from runs.control import post_message
from runs.models import Event, Step, StepAttempt
from runs.services import Actor, submit_run
from tests.conftest import fresh
from tests.support.fake_openai import MODEL, burst_worker, drive, fail, hang, say, turn
from workers.llm import pricing

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures
pytestmark = pytest.mark.django_db(transaction=True)


def llm_steps(run):
    return Step.objects.filter(run=run, kind="llm").order_by("seq")


def tool_messages(body):
    return [m for m in body["messages"] if m["role"] == "tool"]


def test_each_model_and_tool_call_is_a_readable_step_and_the_run_finishes(tenant, fake_llm):
    fake_llm.enqueue(
        say("Let me count.", ("tick", {"i": 1}), ("tick", {"i": 2})), say("Two ticks.")
    )
    run = submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "count twice"})
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["answer"] == "Two ticks."
    assert [(s.name, s.kind) for s in Step.objects.filter(run=run).order_by("seq")] == [
        ("Starting the agent", "custom"),
        ("Thinking (iteration 1)", "llm"),
        ("Calling tick", "tool"),
        ("Calling tick", "tool"),
        ("messages", "message"),
        ("Thinking (iteration 2)", "llm"),
    ]
    assert fake_llm.count == 2
    second = fake_llm.bodies()[1]
    assert [json.loads(m["content"]) for m in tool_messages(second)] == [{"tick": 1}, {"tick": 2}]
    assert second["tools"][0]["function"]["name"] == "tick"
    assert second["tools"][0]["function"]["parameters"]["required"] == ["i"]


def test_a_model_step_stores_only_the_message_it_added(tenant, fake_llm):
    fake_llm.enqueue(say(None, ("tick", {"i": 1})), say(None, ("tick", {"i": 2})), say("done"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "p" * 3000})
    [run] = drive(run)
    assert run.status == "done", run.error
    for step in llm_steps(run):
        assert step.output["role"] == "assistant"
        assert set(step.output) <= {"role", "content", "tool_calls"}
        # The conversation is neither the step's output nor its input.
        assert "p" * 3000 not in json.dumps(step.input) + json.dumps(step.output)
    # ...yet every request carried the whole conversation, rebuilt from the steps.
    assert [len(b["messages"]) for b in fake_llm.bodies()] == [2, 4, 6]


def test_token_and_cost_totals_equal_the_sum_of_steps_and_what_the_server_reported(
    tenant, fake_llm
):
    fake_llm.enqueue(
        say(None, ("tick", {"i": 1}), usage=(1234, 56)),
        fail(500),  # no usage: costs nothing
        say(None, ("tick", {"i": 2}), usage=(2345, 78)),
        say("done", usage=(3456, 90)),
    )
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    assert run.status == "done", run.error
    steps = Step.objects.filter(run=run).aggregate(
        i=Sum("tokens_in"), o=Sum("tokens_out"), c=Sum("cost_cents")
    )
    assert (steps["i"], steps["o"]) == (1234 + 2345 + 3456, 56 + 78 + 90)
    assert fake_llm.usage == [(1234, 56), (2345, 78), (3456, 90)]
    # $2 / $8 per million tokens = 0.0002 / 0.0008 cents per token.
    expected = sum(
        Decimal(i) * Decimal("0.0002") + Decimal(o) * Decimal("0.0008") for i, o in fake_llm.usage
    )
    assert run.cost_cents == steps["c"] == expected
    assert [s.cost_cents for s in llm_steps(run)] == [
        pricing.cost_cents(MODEL, i, o) for i, o in fake_llm.usage
    ]


def test_429_is_retried_after_the_delay_the_server_asked_for(tenant, fake_llm, settings):
    settings.RUNS_BACKOFF_BASE_SECONDS = 0.01  # so the delay is the server's, not the jitter
    fake_llm.enqueue(fail(429, "slow down", retry_after="2"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.error_kind, run.failures) == ("queued", "retryable", 1)
    left = Event.objects.filter(run=run, type="run.queued").latest("seq")
    assert (run.run_after - left.created_at).total_seconds() >= 2
    assert fake_llm.count == 1  # the SDK's own retries are off

    [run] = drive(run)
    assert run.status == "done", run.error
    assert fake_llm.count == 2
    first, second = fake_llm.requests
    assert second["at"] - first["at"] >= 2


def test_400_fails_the_run_at_once(tenant, fake_llm):
    fake_llm.enqueue(fail(400, "messages: invalid"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.error_kind, run.attempt) == ("failed", "fatal", 1)
    assert "400" in run.error
    assert fake_llm.count == 1


def test_500_is_retryable_with_one_request_per_attempt(tenant, fake_llm, settings):
    settings.RUNS_BACKOFF_BASE_SECONDS = 0.01
    fake_llm.enqueue(fail(500), fail(502))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    assert run.status == "done"
    assert run.attempt == 3 and fake_llm.count == 3
    step = llm_steps(run).get()
    assert step.executions == 3
    assert [a.error_kind for a in StepAttempt.objects.filter(step=step).order_by("id")] == [
        "retryable",
        "retryable",
    ]


def test_a_hung_model_call_times_out_as_a_retryable_model_step(tenant, fake_llm, settings):
    settings.RUNS_BACKOFF_BASE_SECONDS = 0.01
    fake_llm.enqueue(hang(4))
    run = submit_run(tenant=tenant, kind="llm_agent_short_timeout", input={})
    [run] = drive(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    retry = Event.objects.get(run=run, type="run.queued", payload__reason="retry")
    assert retry.payload["error_kind"] == "retryable"
    assert "Thinking (iteration 1)" in retry.payload["error"]
    assert "did not return within 1.5 s" in retry.payload["error"]
    attempt = StepAttempt.objects.get(run=run)
    assert attempt.step.kind == "llm" and attempt.error_kind == "retryable"
    assert "StepTimeout" in attempt.error
    assert fake_llm.count == 2


def test_malformed_tool_calls_are_answered_to_the_model_as_tool_errors(tenant, fake_llm):
    fake_llm.enqueue(
        say(
            "Trying.",
            ("tick", '{"i": 1'),
            ("teleport", {"to": "mars"}),
            ("tick", {"i": "one"}),
            ("broken", {"reason": "disk full"}),
        ),
        say("I give up gracefully."),
    )
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    assert run.status == "done", run.error
    answers = tool_messages(fake_llm.bodies()[1])
    assert [m["tool_call_id"] for m in answers] == ["call_1_1", "call_1_2", "call_1_3", "call_1_4"]
    bad_json, unknown, invalid, raised = (m["content"] for m in answers)
    assert bad_json.startswith("Error: the arguments of tick are not valid JSON")
    assert "there is no tool named 'teleport'" in unknown and "tick" in unknown
    assert "invalid arguments for tick: i:" in invalid
    assert raised == "Error: disk full"
    assert all(call["error"] for call in run.result["tool_calls"])
    assert list(Step.objects.filter(run=run, kind="tool").values_list("name", flat=True)) == [
        "Rejecting a call to tick",
        "Rejecting a call to teleport",
        "Rejecting a call to tick",
        "Calling broken",
    ]


def test_the_iteration_limit_is_terminal(tenant, fake_llm):
    fake_llm.brain = lambda body: say(None, ("tick", {"i": turn(body["messages"])}))
    run = submit_run(tenant=tenant, kind="llm_agent", input={"max_iterations": 3})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.error_kind, run.attempt) == ("failed", "step_limit", 1)
    assert fake_llm.count == 3


def test_the_remaining_budget_caps_the_output_tokens_of_each_call(tenant, fake_llm):
    fake_llm.enqueue(say(None, ("tick", {"i": 1}), usage=(1000, 500)), say("done", usage=(10, 10)))
    # 2 cents at 0.0008 cents per output token is 2500 tokens, less the input.
    run = submit_run(tenant=tenant, kind="llm_agent", input={}, cost_ceiling_cents=2)
    [run] = drive(run)
    assert run.status == "done", run.error
    first, second = (b["max_tokens"] for b in fake_llm.bodies())
    assert 2000 < first < 2500
    # The first call spent 0.2 + 0.4 cents: the 1.4 left pay for at most 1750.
    assert 1000 < second < 1750


def test_a_run_whose_budget_cannot_pay_for_a_call_stops_without_calling(tenant, fake_llm):
    fake_llm.enqueue(say(None, ("tick", {"i": 1}), usage=(2000, 1000)))
    run = submit_run(tenant=tenant, kind="llm_agent", input={}, cost_ceiling_cents=1.21)
    burst_worker()
    run = fresh(run)
    assert (run.status, run.error_kind) == ("failed", "budget"), run.error
    assert fake_llm.count == 1


def test_messages_from_people_join_the_conversation_between_iterations(tenant, fake_llm):
    fake_llm.enqueue(say(None, ("tick", {"i": 1})), say("noted"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    post_message(run=run, actor=Actor(type="user", id="7"), text="Please also mention the weather.")
    [run] = drive(run)
    assert run.status == "done", run.error
    first, second = fake_llm.bodies()
    assert "weather" not in json.dumps(first)
    assert second["messages"][-1] == {
        "role": "user",
        "content": "[Message from user:7] Please also mention the weather.",
    }


def test_the_model_and_system_prompt_are_fixed_at_the_start_of_the_run(tenant, fake_llm, settings):
    settings.RUNS_BACKOFF_BASE_SECONDS = 0.01
    fake_llm.enqueue(say(None, ("tick", {"i": 1})), fail(503, retry_after="1"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    burst_worker()
    assert fresh(run).status == "queued"
    settings.LLM_MODEL = "another-model"  # a deploy changed the default
    [run] = drive(run)
    assert run.status == "done", run.error
    assert {b["model"] for b in fake_llm.bodies()} == {MODEL}


def test_a_refusal_fails_the_run_and_keeps_its_cost(tenant, fake_llm):
    fake_llm.enqueue(say("x", usage=(100, 10)))
    fake_llm.queue[0].message["refusal"] = "I can't help with that."
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    burst_worker()
    run = fresh(run)
    assert (run.status, run.error_kind) == ("failed", "fatal")
    assert "refused" in run.error
    assert run.cost_cents == pricing.cost_cents(MODEL, 100, 10) > 0


def test_a_call_to_a_tool_with_an_absurd_name_is_answered_and_the_step_name_stays_short(
    tenant, fake_llm
):
    fake_llm.enqueue(say(None, ("x" * 500, {})), say("ok"))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    assert run.status == "done", run.error
    step = Step.objects.get(run=run, kind="tool")
    assert step.name == "Rejecting a call to " + "x" * 80
    assert "there is no tool named" in tool_messages(fake_llm.bodies()[1])[0]["content"]


def test_model_and_tool_text_a_database_refuses_is_kept_as_replacement_characters(tenant, fake_llm):
    """NUL and lone surrogates in model answers, tool arguments and tool errors: each call is made once."""
    fake_llm.enqueue(
        say("Checking \u0000 now \ud800.", ("broken", {"reason": "disk \u0000 full \udfff"})),
        say("All done \u0000."),
    )
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)

    assert run.status == "done", run.error
    assert fake_llm.count == 2  # no model call was repeated because its answer could not be stored
    assert run.attempt == 1
    assert run.result["answer"] == "All done \ufffd."
    first, second = llm_steps(run)
    assert first.output["content"] == "Checking \ufffd now \ufffd."
    assert first.text_replaced and second.text_replaced
    tool = Step.objects.get(run=run, kind="tool")
    assert "disk \ufffd full \ufffd" in json.dumps(tool.output, ensure_ascii=False)
    # The model saw the stored text on its second call, as a replay would.
    assert "disk \ufffd full \ufffd" in json.dumps(
        tool_messages(fake_llm.bodies()[1]), ensure_ascii=False
    )
