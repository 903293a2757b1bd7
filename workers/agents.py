"""Built-in agent kinds that work offline, so that `make run` shows runs moving.

``research_brief`` looks like real agent work: it plans, searches several
sources, reads and extracts facts, drafts, reviews and writes a brief. Its
"model" and "tools" are deterministic functions of the input with realistic
latencies (scaled by RUNS_DEMO_DELAY_SCALE), so a replay after a crash
returns the same data and costs nothing.
"""

from __future__ import annotations

import hashlib
import time

from django.conf import settings
from pydantic import BaseModel, Field

from workers.context import RunContext, StepResult
from workers.registry import agent

SOURCES = ["company site", "press releases", "industry news", "job postings", "public filings"]


class BriefIn(BaseModel):
    topic: str = Field(min_length=2, max_length=200, description="What the brief is about")
    depth: int = Field(default=3, ge=1, le=5, description="How many sources to read")


def _pause(seconds: float) -> None:
    time.sleep(seconds * settings.RUNS_DEMO_DELAY_SCALE)


def _digest(*parts: str) -> int:
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest()[:8], 16)


def _model_call(prompt: str, tokens_out: int, latency: float) -> StepResult:
    _pause(latency)
    tokens_in = 40 + len(prompt) // 4
    # Priced like a small hosted model: $0.15 / $0.60 per million tokens.
    cost = tokens_in * 0.15e-4 + tokens_out * 0.60e-4
    return StepResult(output=None, tokens_in=tokens_in, tokens_out=tokens_out, cost_cents=round(cost, 6))


def plan(topic: str, depth: int) -> StepResult:
    usage = _model_call(f"Plan research on {topic}", 120, 0.8)
    sources = [SOURCES[(_digest(topic) + i) % len(SOURCES)] for i in range(depth)]
    questions = [f"What does {topic} do?", f"Who are {topic}'s customers?", f"What changed at {topic} recently?"]
    return StepResult({"sources": sources, "questions": questions}, usage.tokens_in, usage.tokens_out, usage.cost_cents)


def search(topic: str, source: str) -> dict:
    _pause(0.6)
    n = 2 + _digest(topic, source) % 3
    return {"source": source, "hits": [f"{source}: {topic} item {i + 1}" for i in range(n)]}


def extract(topic: str, found: list[dict]) -> StepResult:
    hits = [hit for result in found for hit in result["hits"]]
    usage = _model_call(f"Extract facts about {topic} from {hits}", 300, 1.2)
    facts = [f"{hit} mentions {topic} ({_digest(hit) % 90 + 10}% relevance)" for hit in hits[:6]]
    return StepResult({"facts": facts}, usage.tokens_in, usage.tokens_out, usage.cost_cents)


def draft(topic: str, facts: list[str]) -> StepResult:
    usage = _model_call(f"Draft a brief on {topic} from {facts}", 600, 1.5)
    body = f"{topic}: {len(facts)} findings. " + " ".join(f"({i + 1}) {fact}." for i, fact in enumerate(facts))
    return StepResult({"draft": body}, usage.tokens_in, usage.tokens_out, usage.cost_cents)


def review(text: str) -> StepResult:
    usage = _model_call(f"Review: {text}", 150, 0.9)
    return StepResult({"approved": True, "notes": "Concise; sources cited."}, usage.tokens_in, usage.tokens_out, usage.cost_cents)


@agent("research_brief", input_schema=BriefIn, max_attempts=3)
def research_brief(ctx: RunContext, brief: BriefIn) -> dict:
    """Research a company or topic across several sources and write a short, cited brief."""
    ctx.progress(total=brief.depth + 4)
    the_plan = ctx.step("plan", plan, brief.topic, brief.depth, kind="llm")
    found = [ctx.step(f"search:{source}", search, brief.topic, source, kind="tool") for source in the_plan["sources"]]
    facts = ctx.step("extract_facts", extract, brief.topic, found, kind="llm")["facts"]
    text = ctx.step("draft", draft, brief.topic, facts, kind="llm")["draft"]
    verdict = ctx.step("review", review, text, kind="llm")
    return {
        "topic": brief.topic,
        "brief": text,
        "questions": the_plan["questions"],
        "sources": the_plan["sources"],
        "review": verdict["notes"],
    }
