"""A real worker process killed in the middle of an LLM run: the resumed run makes only the remaining model calls."""

from __future__ import annotations

import signal
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from runs.models import Step
from runs.services import submit_run
from tests.conftest import fresh
from tests.support.fake_openai import say, turn
from tests.support.waiting import wait_until

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures
pytestmark = pytest.mark.django_db(transaction=True)

MODEL_CALLS = 8
HOLD_AT = 5  # the 5th model call asks for the tool the worker is killed in


def test_a_run_killed_after_its_5th_model_call_resumes_with_exactly_the_remaining_calls(
    tenant, processes, fake_llm, tmp_path
):
    hold_file = tmp_path / "hold"
    hold_file.touch()

    def brain(body):
        n = turn(body["messages"])
        if n == MODEL_CALLS:
            return say(f"finished after {n} model calls")
        if n == HOLD_AT:
            return say(None, ("hold", {"path": str(hold_file)}))
        return say(None, ("tick", {"i": n}))

    fake_llm.brain = brain
    run = submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "count"})
    first = processes.worker("--lease", "3", "--heartbeat", "1", "--poll", "0.2", **fake_llm.env)
    wait_until(
        lambda: fresh(run).current_step == "Calling hold",
        what="the tool call after the 5th model call",
    )
    assert fake_llm.count == HOLD_AT
    assert Step.objects.filter(run=run, kind="llm", status="done").count() == HOLD_AT

    first.send_signal(signal.SIGKILL)
    first.wait(10)
    hold_file.unlink()
    wait_until(
        lambda: fresh(run).locked_until < timezone.now(), timeout=10, what="the lease to expire"
    )
    reaped = processes.run("reap", "--once")
    assert "rescued=1" in reaped.stdout, reaped.stdout + reaped.stderr
    assert fake_llm.count == HOLD_AT

    second = processes.worker("--burst", **fake_llm.env)
    assert second.wait(60) == 0, processes.output(second)
    run = fresh(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert run.result["answer"] == f"finished after {MODEL_CALLS} model calls"
    # 5 calls before the kill, then exactly the 3 that remained.
    assert fake_llm.count == MODEL_CALLS
    model_steps = Step.objects.filter(run=run, kind="llm")
    assert model_steps.count() == MODEL_CALLS
    assert set(model_steps.values_list("executions", flat=True)) == {1}
    # The resumed worker rebuilt the same conversation from the step log.
    sixth = fake_llm.bodies()[HOLD_AT]
    assert sum(1 for m in sixth["messages"] if m["role"] == "assistant") == HOLD_AT
    assert sixth["messages"][-1]["content"] == "released"

    # The money of both processes adds up to what the provider reported.
    totals = Step.objects.filter(run=run).aggregate(
        i=Sum("tokens_in"), o=Sum("tokens_out"), c=Sum("cost_cents")
    )
    assert totals["i"] == sum(i for i, _ in fake_llm.usage)
    assert totals["o"] == sum(o for _, o in fake_llm.usage)
    expected = sum(
        Decimal(i) * Decimal("0.0002") + Decimal(o) * Decimal("0.0008") for i, o in fake_llm.usage
    )
    assert run.cost_cents == totals["c"] == expected
