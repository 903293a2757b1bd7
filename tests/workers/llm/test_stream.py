"""Model text shown while a call runs: streamed answers from a real loopback server, and the loop's live events."""

from __future__ import annotations

import json

import openai
import pytest

from runs.models import Step
from runs.services import submit_run
from tests.support.fake_openai import MODEL, drive, fail, say
from workers.context import RunContext
from workers.errors import Fatal
from workers.llm import OpenAIChat, ScriptedModel, pricing
from workers.llm.loop import LiveText

pytest_plugins = ["tests.support.fake_openai"]  # the fake_llm and offline fixtures

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Tell me about foxes."},
]
ANSWER = "The quick brown fox jumps over the lazy dog, and then it naps in the afternoon sun."


def complete(**kwargs):
    return OpenAIChat().complete(CONVERSATION, tools=[], max_tokens=None, timeout=10, **kwargs)


def test_streamed_text_arrives_in_pieces_that_make_the_final_content(fake_llm):
    fake_llm.enqueue(say(ANSWER))
    pieces: list[str] = []
    done = complete(on_text=pieces.append)
    assert len(pieces) > 3
    assert "".join(pieces) == done.message["content"] == ANSWER
    assert done.message == {"role": "assistant", "content": ANSWER}
    assert done.finish_reason == "stop"
    [body] = fake_llm.bodies()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_streamed_tool_calls_usage_and_cost_are_those_of_the_same_answer_in_one_piece(fake_llm):
    calls = [
        ("tick", {"i": 1, "note": "a longer argument, cut into many pieces"}),
        ("broken", '{"reason": "x"}'),
    ]
    fake_llm.enqueue(
        say("Counting.", *calls, usage=(1234, 56)), say("Counting.", *calls, usage=(1234, 56))
    )
    pieces: list[str] = []
    streamed = complete(on_text=pieces.append)
    whole = complete()
    assert [b.get("stream", False) for b in fake_llm.bodies()] == [True, False]
    assert streamed == whole
    assert streamed.message["tool_calls"] == [
        {
            "id": "call_1_1",
            "type": "function",
            "function": {"name": "tick", "arguments": json.dumps(calls[0][1])},
        },
        {
            "id": "call_1_2",
            "type": "function",
            "function": {"name": "broken", "arguments": '{"reason": "x"}'},
        },
    ]
    assert streamed.finish_reason == "tool_calls"
    assert "".join(pieces) == "Counting."
    assert (streamed.tokens_in, streamed.tokens_out) == (1234, 56)
    assert streamed.cost_cents == pricing.cost_cents(MODEL, 1234, 56) > 0


def test_a_streamed_answer_with_only_tool_calls_has_no_content_and_no_text(fake_llm):
    fake_llm.enqueue(
        say(None, ("tick", {"i": 1}), usage=(10, 5)), say(None, ("tick", {"i": 1}), usage=(10, 5))
    )
    pieces: list[str] = []
    streamed = complete(on_text=pieces.append)
    assert streamed == complete()
    assert streamed.message["content"] is None
    assert pieces == []


def test_a_refusal_in_a_stream_is_fatal_and_keeps_its_cost(fake_llm):
    fake_llm.enqueue(say("Sorry", usage=(100, 10)))
    fake_llm.queue[0].message["refusal"] = "I can't help with that."
    with pytest.raises(Fatal, match="refused: I can't help with that.") as refused:
        complete(on_text=lambda text: None)
    assert refused.value.usage == (100, 10, float(pricing.cost_cents(MODEL, 100, 10)))


def test_an_error_status_on_a_streamed_request_raises_as_without_streaming(fake_llm):
    fake_llm.enqueue(fail(429, "slow down", retry_after="2"), fail(400, "messages: invalid"))
    with pytest.raises(openai.RateLimitError) as limited:
        complete(on_text=lambda text: None)
    assert limited.value.response.headers["retry-after"] == "2"
    with pytest.raises(openai.BadRequestError, match="messages: invalid"):
        complete(on_text=lambda text: None)


def test_the_scripted_model_passes_its_text_on_in_words_and_answers_the_same(settings):
    settings.RUNS_DEMO_DELAY_SCALE = 0
    model = ScriptedModel(
        lambda messages, tools: {
            "content": ANSWER,
            "tool_calls": [{"name": "tick", "arguments": {}}],
        }
    )
    pieces: list[str] = []
    streamed = model.complete(
        CONVERSATION, tools=[], max_tokens=None, timeout=None, on_text=pieces.append
    )
    assert 1 < len(pieces) <= 4
    assert "".join(pieces) == ANSWER
    assert all(piece.strip() for piece in pieces)  # cut between words
    assert streamed == model.complete(CONVERSATION, tools=[], max_tokens=None, timeout=None)


class Recorder:
    """A stand-in run context that keeps what is emitted, at a clock the test moves."""

    run_id = "run"

    def __init__(self) -> None:
        self.now = 0.0
        self.events: list[tuple[str, dict]] = []

    def emit(self, type: str, data: dict) -> None:
        self.events.append((type, data))


def test_live_text_is_shown_at_most_every_quarter_second_and_once_more_when_done():
    ctx = Recorder()
    live = LiveText(ctx, iteration=3, clock=lambda: ctx.now)
    for at, piece in [
        (0.0, "One "),
        (0.1, "two "),
        (0.2, "three "),
        (0.3, "four "),
        (0.5, "five "),
        (0.54, "six"),
    ]:
        ctx.now = at
        live(piece)
    live.close()
    assert ctx.events == [
        ("model.text", {"iteration": 3, "text": "One ", "done": False}),
        ("model.text", {"iteration": 3, "text": "One two three four ", "done": False}),
        ("model.text", {"iteration": 3, "text": "One two three four five six", "done": True}),
    ]


def test_live_text_sends_the_end_of_a_long_text_small_enough_for_an_event():
    ctx = Recorder()
    live = LiveText(ctx, iteration=1)
    live("a" * 4000 + "b" * 999 + "z")
    live.close()
    assert [data["text"] for _, data in ctx.events] == ["a" * 1000 + "b" * 999 + "z"] * 2

    wide = Recorder()
    live = LiveText(wide, iteration=1)
    text = "狐" * 3000 + "🦊" * 500 + "\u0000\n" * 10
    live(text)
    live.close()
    [(_, shown), (_, done)] = wide.events
    assert shown["text"] and text.endswith(shown["text"]) and len(shown["text"]) <= 2000
    assert (
        len(json.dumps(shown).encode()) <= 7000
        and len(json.dumps(done, ensure_ascii=False).encode()) <= 7000
    )


def test_no_text_no_event_and_a_failing_emit_is_not_the_calls_problem():
    class Broken(Recorder):
        def emit(self, type: str, data: dict) -> None:
            raise ValueError("no stream today")

    quiet = Recorder()
    LiveText(quiet, iteration=1).close()
    assert quiet.events == []
    live = LiveText(Broken(), iteration=1)
    live("text")
    live.close()  # nothing raised


@pytest.fixture
def shown(monkeypatch):
    """What the loop emits through the real RunContext (and the real ``emit``, once there is one)."""
    events: list[tuple[str, dict]] = []
    refused: list[Exception] = []
    real = getattr(RunContext, "emit", None)

    def emit(self, type: str, data: dict) -> None:
        events.append((type, data))
        if real is not None:
            try:
                real(self, type, data)
            except Exception as exc:
                refused.append(exc)
                raise

    monkeypatch.setattr(RunContext, "emit", emit, raising=False)
    yield events
    assert refused == []


@pytest.mark.django_db(transaction=True)
def test_the_loop_shows_each_model_calls_text_and_a_replay_shows_nothing(
    tenant, fake_llm, settings, shown
):
    settings.RUNS_BACKOFF_BASE_SECONDS = 0.01
    fake_llm.enqueue(say("Let me count the ticks.", ("tick", {"i": 1})), fail(500), say(ANSWER))
    run = submit_run(tenant=tenant, kind="llm_agent", input={"prompt": "count"})
    [run] = drive(run)
    assert (run.status, run.attempt) == ("done", 2), run.error
    assert {type for type, _ in shown} == {"model.text"}
    # The second attempt replayed iteration 1 without calling the model, so it showed nothing again.
    finals = [data for _, data in shown if data["done"]]
    assert [(d["iteration"], d["text"]) for d in finals] == [
        (1, "Let me count the ticks."),
        (2, ANSWER),
    ]
    outputs = (
        Step.objects.filter(run=run, kind="llm").order_by("seq").values_list("output", flat=True)
    )
    assert [o["content"] for o in outputs] == [d["text"] for d in finals]
    for _, data in shown:
        final = next(d for d in finals if d["iteration"] == data["iteration"])
        assert final["text"].startswith(data["text"])


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_events_cannot_be_shown_finishes_all_the_same(tenant, fake_llm, monkeypatch):
    def emit(self, type: str, data: dict) -> None:
        raise RuntimeError("the event stream is down")

    monkeypatch.setattr(RunContext, "emit", emit, raising=False)
    fake_llm.enqueue(say(ANSWER))
    run = submit_run(tenant=tenant, kind="llm_agent", input={})
    [run] = drive(run)
    assert run.status == "done", run.error
    assert run.result["answer"] == ANSWER
