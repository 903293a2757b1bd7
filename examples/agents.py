"""Example agent kinds that work offline, so that `make run` shows runs moving (RUNS_EXAMPLES=1).

``research`` is a real tool-calling agent on ``workers.llm``: with a
provider configured it uses it, without one a deterministic scripted model
drives the same loop and tools (the CRM demo's ``crm_update`` lives with its
app, in ``examples/crm/agents.py``).

``research_many`` is a lead agent: one child ``research`` run per question,
gathered (``min_success``), then a synthesis step.

``research_brief`` looks like real agent work: it plans, searches several
sources, reads and extracts facts, drafts, reviews and writes a brief. Its
"model" and "tools" are deterministic functions of the input with realistic
latencies (scaled by RUNS_DEMO_DELAY_SCALE), so a replay after a crash
returns the same data and costs nothing.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
import time

from django.conf import settings
from pydantic import BaseModel, Field, field_validator, model_validator

from runs.registry import agent
from runs.states import RunOutcome
from workers.context import RunContext
from workers.errors import Fatal
from workers.llm.tools import ToolError, tool
from workers.proposals import Change, Proposal
from workers.values import StepResult

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
    return StepResult(
        output=None, tokens_in=tokens_in, tokens_out=tokens_out, cost_cents=round(cost, 6)
    )


def plan(topic: str, depth: int) -> StepResult:
    usage = _model_call(f"Plan research on {topic}", 120, 0.8)
    sources = [SOURCES[(_digest(topic) + i) % len(SOURCES)] for i in range(depth)]
    questions = [
        f"What does {topic} do?",
        f"Who are {topic}'s customers?",
        f"What changed at {topic} recently?",
    ]
    return StepResult(
        {"sources": sources, "questions": questions},
        usage.tokens_in,
        usage.tokens_out,
        usage.cost_cents,
    )


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
    body = f"{topic}: {len(facts)} findings. " + " ".join(
        f"({i + 1}) {fact}." for i, fact in enumerate(facts)
    )
    return StepResult({"draft": body}, usage.tokens_in, usage.tokens_out, usage.cost_cents)


def review(text: str) -> StepResult:
    usage = _model_call(f"Review: {text}", 150, 0.9)
    return StepResult(
        {"approved": True, "notes": "Concise; sources cited."},
        usage.tokens_in,
        usage.tokens_out,
        usage.cost_cents,
    )


@agent("research_brief", input_schema=BriefIn, max_attempts=3)
def research_brief(ctx: RunContext, brief: BriefIn) -> dict:
    """Research a company or topic across several sources and write a short, cited brief."""
    ctx.progress(total=brief.depth + 4)
    the_plan = ctx.step("plan", plan, brief.topic, brief.depth, kind="llm")
    found = [
        ctx.step(f"search:{source}", search, brief.topic, source, kind="tool")
        for source in the_plan["sources"]
    ]
    facts = ctx.step("extract_facts", extract, brief.topic, found, kind="llm")["facts"]
    text = ctx.step("draft", draft, brief.topic, facts, kind="llm")["draft"]
    verdict = ctx.step("review", review, text, kind="llm")
    ctx.report(
        f"Wrote a brief on {brief.topic}: {len(facts)} findings from {len(the_plan['sources'])} sources"
    )
    return {
        "topic": brief.topic,
        "brief": text,
        "questions": the_plan["questions"],
        "sources": the_plan["sources"],
        "review": verdict["notes"],
    }


# LLM agents: the tool-calling loop of workers.llm, driven by the model of
# LLM_BASE_URL / LLM_MODEL, or offline by a scripted model (workers.llm.scripts).

RESEARCH_SYSTEM = (
    "You are a careful research assistant answering from a local document corpus only. "
    "First write a short plan. Then search with search_docs (several queries if useful) and read the most "
    "relevant documents with read_doc. Answer concisely and cite every claim with the document id in square "
    "brackets, like [leases-and-heartbeats]. If the corpus does not answer the question, say so."
)


class ResearchIn(BaseModel):
    question: str = Field(
        min_length=3, max_length=500, description="What to find out from the document corpus"
    )
    max_sources: int = Field(
        default=3, ge=1, le=6, description="How many documents to read at most"
    )


@agent("research", input_schema=ResearchIn, max_attempts=3, max_model_iterations=12)
def research(ctx: RunContext, data: ResearchIn) -> dict:
    """Answer a question from the local document corpus: plan, search, read, answer with citations."""
    from workers.llm import corpus, run_agent_loop
    from workers.llm.scripts import RESEARCH_USER, research_script

    result = run_agent_loop(
        ctx,
        system=RESEARCH_SYSTEM,
        user=RESEARCH_USER.format(question=data.question, max_sources=data.max_sources),
        tools=[corpus.search_docs, corpus.read_doc],
        max_iterations=10,
        script=research_script,
    )
    docs = corpus.documents()
    cited = [
        doc_id
        for doc_id in dict.fromkeys(re.findall(r"\[([a-z0-9-]+)\]", result.answer))
        if doc_id in docs
    ]
    first = next((m for m in result.messages if m.get("role") == "assistant"), {})
    if cited:
        sources = f"{len(cited)} document{'s' if len(cited) > 1 else ''}"
        ctx.report(f"Answered from {sources}: {result.answer}")
    else:
        ctx.report(
            f"Answered without a source from the corpus: {result.answer}",
            outcome=RunOutcome.PARTIAL,
        )
    return {
        "question": data.question,
        "answer": result.answer,
        "citations": [{"doc_id": doc_id, "title": docs[doc_id].title} for doc_id in cited],
        "plan": first.get("content") or "",
        "iterations": result.iterations,
        "model": result.model,
    }


class ResearchManyIn(BaseModel):
    questions: list[str] = Field(
        min_length=1, max_length=10, description="One child research run per question"
    )
    min_success: int | None = Field(
        default=None,
        ge=1,
        le=10,
        description="Synthesise once this many answered (the rest are cancelled)",
    )
    timeout_seconds: float | None = Field(
        default=None, gt=0, le=86400, description="Stop waiting for the children after this long"
    )

    @field_validator("questions")
    @classmethod
    def _questions(cls, questions: list[str]) -> list[str]:
        for question in questions:
            if not 3 <= len(question.strip()) <= 500:
                raise ValueError("each question must be 3 to 500 characters")
        return [q.strip() for q in questions]

    @model_validator(mode="after")
    def _reachable(self) -> ResearchManyIn:
        if self.min_success is not None and self.min_success > len(self.questions):
            raise ValueError("min_success cannot exceed the number of questions")
        return self


@agent("research_many", input_schema=ResearchManyIn, max_attempts=3)
def research_many(ctx: RunContext, data: ResearchManyIn) -> dict:
    """A lead agent: one child ``research`` run per question, gathered, then a synthesis of what they found."""
    children = [
        ctx.spawn("research", {"question": q}, key=f"q{i}") for i, q in enumerate(data.questions)
    ]
    outcomes = ctx.gather(children, min_success=data.min_success, timeout=data.timeout_seconds)
    answered = [o for o in outcomes if o.succeeded]
    if not answered:
        raise Fatal(
            "none of the child research runs answered: "
            + "; ".join(
                f"{o.status}: {o.error.splitlines()[0] if o.error else 'no answer'}"
                for o in outcomes
            )
        )
    found = [
        {"run_id": str(o.run_id), "status": o.status, "result": o.result, "error": o.error}
        for o in outcomes
    ]
    report = ctx.step("synthesise", synthesise, data.questions, found, kind="llm")
    ctx.report(
        report["summary"],
        outcome=RunOutcome.SUCCEEDED if len(answered) == len(outcomes) else RunOutcome.PARTIAL,
    )
    return report


def synthesise(questions: list[str], outcomes: list[dict]) -> StepResult:
    """Join the children's answers into one report, with their citations and what went unanswered."""
    usage = _model_call("Synthesise: " + " ".join(questions), 180, 0.6)
    sections, sources, unanswered = [], {}, []
    for question, outcome in zip(questions, outcomes, strict=True):
        result = outcome.get("result") or {}
        if outcome["status"] != "done":
            unanswered.append({"question": question, "status": outcome["status"]})
            continue
        sections.append(
            {"question": question, "answer": result.get("answer", ""), "run_id": outcome["run_id"]}
        )
        for cited in result.get("citations", []):
            sources[cited["doc_id"]] = cited["title"]
    summary = f"{len(sections)} of {len(questions)} questions answered from {len(sources)} sources."
    report = {
        "summary": summary,
        "sections": sections,
        "sources": [{"doc_id": k, "title": v} for k, v in sources.items()],
        "unanswered": unanswered,
    }
    return StepResult(report, usage.tokens_in, usage.tokens_out, usage.cost_cents)


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


# The framework adapters' example kinds, where their extra is installed (agentruns[pydantic-ai],
# agentruns[openai-agents]). Each imports its framework on its first run, not here: every web and worker
# process imports this module.
if importlib.util.find_spec("pydantic_ai") is not None:
    import examples.frameworks.pydantic_ai_example  # noqa: E402, F401 - registers pydantic_ai_demo
if _installed(
    "openai-agents"
):  # its package is named "agents": ask for the distribution, not the name
    import examples.frameworks.openai_agents_example  # noqa: E402, F401 - registers openai_agents_demo


# A conversation (runs.threads): each turn of a support thread is one run of this kind.

SUPPORT_SYSTEM = (
    "You are the support assistant of an agent-runs platform, talking with one customer in a "
    "conversation that lasts several turns. Answer from the documentation (search_docs), citing "
    "the document id in square brackets. A credit or refund goes through issue_credit, which a "
    "colleague approves first. Be brief."
)
# Words that end a conversation: the turn replies, then closes the thread.
GOODBYE = re.compile(r"\b(thanks|thank you|bye|that's all)\b", re.IGNORECASE)


def describe_credit(ctx: RunContext, amount_cents: int, reason: str) -> Proposal:
    """What a credit would change: the credits given in this conversation, before and after."""
    thread = ctx.thread
    given = ctx.state.get("credits_cents", 0)
    return Proposal(
        summary=f"Credit {amount_cents} cents to the customer of thread “{thread.title if thread else ''}”",
        target=f"Thread {thread.id if thread else ''}",
        changes=[Change("credits given (cents)", given, given + amount_cents)],
        details={"reason": reason},
    )


@tool(side_effect=True, needs_approval=True, propose=describe_credit)
def issue_credit(ctx: RunContext, amount_cents: int, reason: str) -> dict:
    """Credit the customer's account. A person approves every credit before it is issued."""
    if not 1 <= amount_cents <= 100_000:
        raise ToolError("a credit is between 1 and 100000 cents")
    key = ctx.idempotency_key or ""
    # The credit's reference comes from the step's idempotency key: a replay gives the same one.
    return {
        "credited_cents": amount_cents,
        "reference": "CR-" + hashlib.sha256(key.encode()).hexdigest()[:8].upper(),
    }


@agent("support_assistant", max_attempts=3, max_model_iterations=6)
def support_assistant(ctx: RunContext, data: dict) -> dict:
    """One turn of a support conversation: read the customer, answer (a credit waits for a person), remember.

    Uses the thread's history (the LLM loop shows the model the earlier
    turns, bounded), its state (goal, facts, open questions, credits, risk
    flags: what it keeps between turns instead of the whole conversation),
    an approval inside the turn (``issue_credit``), and ``close_thread``
    when the customer says goodbye.
    """
    from workers.llm import corpus, run_agent_loop
    from workers.llm.scripts import SUPPORT_USER, json_or_none, support_script

    if ctx.thread is None:
        raise Fatal("support_assistant plays the turns of a thread: POST /api/threads")
    state = ctx.state
    said = [m["text"] for m in ctx.messages()]
    if not said:
        ctx.reply("I'm here: what can I help you with?")
        return {"answer": None}
    text = "\n".join(said)
    result = run_agent_loop(
        ctx,
        system=SUPPORT_SYSTEM,
        user=SUPPORT_USER.format(text=text),
        tools=[corpus.search_docs, issue_credit],
        max_iterations=5,
        script=support_script,
    )
    credits = [c for c in result.tool_calls if c.get("name") == "issue_credit"]
    credited = 0
    for call in credits:
        answer = json_or_none(call.get("content"))
        if isinstance(answer, dict) and not call.get("error"):
            credited += int(answer.get("credited_cents") or 0)
    cited = re.findall(r"\[([a-z0-9-]+)\]", result.answer)
    facts = (state.get("facts") or []) + [f"{ctx.thread.turn}: {cite}" for cite in cited]
    questions = [q for q in state.get("open_questions") or [] if q not in said]
    if not cited and not credits and not GOODBYE.search(text):
        questions.append(text[:200])
    risk = set(state.get("risk_flags") or [])
    if credited:
        risk.add("credit issued")
    if re.search(r"\b(angry|lawyer|cancel my account)\b", text, re.IGNORECASE):
        risk.add("unhappy customer")
    ctx.update_state(
        {
            "goal": state.get("goal") or said[0][:200],
            "facts": facts[-20:],
            "open_questions": questions[-10:],
            "credits_cents": state.get("credits_cents", 0) + credited,
            "risk_flags": sorted(risk),
            "turns": ctx.thread.turn,
        }
    )
    ctx.reply(result.answer)
    if GOODBYE.search(text):
        ctx.close_thread(
            f"Closed after {ctx.thread.turn} turns: {state.get('goal') or said[0]}"[:300]
        )
    ctx.report(result.answer[:300])
    return {"answer": result.answer, "credited_cents": credited}
