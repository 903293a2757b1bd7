"""The tool-calling loop, each model call and each tool call one checkpointed step.

A model step stores only the assistant message it added; a tool step only
what the model was told; the first step ("Starting the agent") the model,
the system prompt and the user's prompt. On replay every step returns what
it recorded, so the loop rebuilds the same conversation from the step log,
deterministically and for free, and a run that died at its 9th model call
makes the calls from the 9th on only. The dashboard reads the same steps to
show each model call as a transcript.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from runs.actors import sentence_start
from workers.errors import StopRun
from workers.llm import artifacts, capacity, conf, pricing
from workers.llm.providers import ChatModel, Script, choose_model, model_for
from workers.llm.tools import Tool, ToolError, tool
from workers.proposals import UNKNOWN, Change, Proposal
from workers.values import StepResult

if TYPE_CHECKING:
    from workers.context import RunContext

# The SDK gives up this long after the step's timeout, so a hung request
# ends its thread well before the worker counts the thread as stuck.
SDK_TIMEOUT_MARGIN_SECONDS = 5.0
# A model call's text is shown this often at most, its last characters
# only, and small enough for ctx.emit (7000 bytes of JSON) with room for the
# rest of the event.
LIVE_TEXT_INTERVAL_SECONDS = 0.25
# In a turn of a thread, the conversation the model is shown before ``user``: the thread's last
# lines, at most this many and this many characters (the oldest are cut), after the thread's
# state, which stands for what was cut (runs.threads: the canonical agent state, not a fat context).
HISTORY_LINES = 40
HISTORY_CHARS = 12_000
LIVE_TEXT_CHARS = 2000
LIVE_TEXT_JSON_BYTES = 6000

logger = logging.getLogger(__name__)


@dataclass
class AgentResult:
    """What ``run_agent_loop`` returns: the final answer and what happened on the way."""

    answer: str
    iterations: int
    model: str
    tool_calls: list[dict] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON for a run's result (without the conversation, which the step log holds)."""
        data = asdict(self)
        data.pop("messages")
        return data


def run_agent_loop(
    ctx: RunContext,
    *,
    system: str,
    user: str,
    tools: Iterable[Tool | Callable[..., Any]] = (),
    max_iterations: int = 25,
    model: ChatModel | str | None = None,
    script: Script | None = None,
    timeout: float | None = None,
    max_output_tokens: int | None = None,
    history: bool = True,
) -> AgentResult:
    """Let a model work on ``user`` with ``tools`` until it answers without calling one.

    Each model call is one step (``kind="llm"``, named "Thinking (iteration
    N)") and each tool call one step (``kind="tool"``, ``"Calling <tool>"``);
    a tool declared ``needs_approval`` waits for a person first (shown a
    ``Proposal``: its ``propose`` function's, else the call's arguments), and a
    ``side_effect`` tool runs write-ahead with an idempotency key. Messages
    people send to the run join the conversation between iterations. A
    malformed call (arguments that are not valid JSON or do not fit the
    schema, an unknown tool) and a ``ToolError`` are answered to the model
    as tool errors. Tool output over ``RUNS_ARTIFACT_THRESHOLD_BYTES``
    becomes an Artifact and the model sees an excerpt.

    ``model`` is a ``ChatModel``, a model name for the configured provider,
    or None for ``LLM_MODEL``; with no provider configured (no
    ``LLM_BASE_URL``) a ``ScriptedModel`` driven by ``script`` stands in.
    The model, the system prompt and ``user`` are recorded at the run's
    start and kept for the whole run. ``max_iterations`` model calls
    without a final answer fail the run (``step_limit``); the run's
    remaining budget caps each call's output tokens (with
    ``max_output_tokens``, default ``LLM_MAX_OUTPUT_TOKENS``). ``timeout``
    overrides the step timeout of model calls. While a model call runs, its text so far is shown on the
    run's live event streams (``model.text`` events, never stored).

    In a turn of a thread (``ctx.thread``), with ``history``, the model is
    shown the conversation before ``user``: the thread's state, then its
    last lines (``ctx.history``, at most ``HISTORY_LINES`` and
    ``HISTORY_CHARS``; older lines are cut, never resent) as user and
    assistant messages, leaving out this turn's own messages (which
    ``user`` carries). Recorded, so a replay shows the model the same.
    """
    toolbox: dict[str, Tool] = {}
    for item in tools:
        declared = item if isinstance(item, Tool) else tool(item)
        toolbox[declared.name] = declared
    specs = [t.spec() for t in toolbox.values()]

    chosen = choose_model(model, script=script)
    setup = ctx.step(
        "Starting the agent", lambda: {**chosen.describe(), "system": system, "user": user}
    )
    chat = (
        model
        if isinstance(model, ChatModel)
        else model_for(setup["provider"], setup["model"], script=script)
    )

    step_timeout = ctx.step_timeout(timeout)
    cap = max_output_tokens or conf.get("LLM_MAX_OUTPUT_TOKENS")
    # Runs started before the prompt was recorded have none: theirs is the one passed in.
    conversation: list[dict] = [
        {"role": "system", "content": setup["system"]},
        *(thread_context(ctx) if history and ctx.thread is not None else []),
        {"role": "user", "content": setup.get("user", user)},
    ]
    calls_made: list[dict] = []

    for iteration in range(1, max_iterations + 2):
        if iteration > max_iterations:
            raise StopRun(
                "step_limit",
                f"the agent made {max_iterations} model calls without a final answer (max_iterations)",
            )
        if iteration > 1:
            for message in ctx.messages():
                conversation.append(
                    {
                        "role": "user",
                        "content": f"[Message from {message['author']}] {message['text']}",
                    }
                )

        snapshot = list(conversation)

        def think(
            request: dict, snapshot: list[dict] = snapshot, iteration: int = iteration
        ) -> StepResult:
            limit = _output_limit(ctx, chat, snapshot, specs, cap)
            with capacity.model_call(
                ctx,
                provider=chat.provider,
                model=chat.model,
                prompt=[snapshot, specs],
                max_tokens=limit,
            ) as usage:
                live = LiveText(ctx, iteration=iteration)
                # A ChatModel written before on_text existed still works, without live text.
                extra = {"on_text": live} if _accepts_on_text(chat) else {}
                try:
                    done = chat.complete(
                        snapshot,
                        tools=specs,
                        max_tokens=limit,
                        timeout=step_timeout + SDK_TIMEOUT_MARGIN_SECONDS,
                        **extra,
                    )
                finally:
                    live.close()
                usage.tokens = done.tokens_in + done.tokens_out
            return StepResult(done.message, done.tokens_in, done.tokens_out, done.cost_cents)

        request = {
            "model": chat.model,
            "iteration": iteration,
            "messages": len(snapshot),
            "tools": list(toolbox),
        }
        assistant = ctx.step(
            f"Thinking (iteration {iteration})",
            think,
            kwargs={"request": request},
            kind="llm",
            timeout=step_timeout,
        )
        conversation.append(assistant)
        calls = assistant.get("tool_calls") or []
        if not calls:
            return AgentResult(
                answer=assistant.get("content") or "",
                iterations=iteration,
                model=chat.model,
                tool_calls=calls_made,
                messages=conversation,
            )
        for call in calls:
            outcome = _use_tool(ctx, toolbox, call, note=assistant.get("content") or "")
            calls_made.append(outcome)
            conversation.append(
                {"role": "tool", "tool_call_id": call.get("id", ""), "content": outcome["content"]}
            )
    raise AssertionError("unreachable")


def thread_context(ctx: RunContext) -> list[dict]:
    """The messages a turn's model sees before its prompt: the thread's state and its last lines, bounded."""
    assert ctx.thread is not None
    turn = ctx.thread.turn
    lines = [
        line
        for line in ctx.history(limit=HISTORY_LINES)
        if not (line["role"] == "user" and line["turn"] == turn)  # this turn's: in its prompt
    ]
    kept: list[dict] = []
    used = 0
    for line in reversed(lines):
        used += len(line["text"])
        if used > HISTORY_CHARS and kept:
            break
        kept.append(line)
    kept.reverse()
    cut = len(lines) - len(kept)
    state = ctx.state
    preface = "This is a turn of an ongoing conversation."
    if state:
        preface += (
            " What you keep between turns (the thread's state): "
            + json.dumps(state, ensure_ascii=False, sort_keys=True)[: HISTORY_CHARS // 4]
        )
    if cut:
        preface += f" {cut} earlier lines of the conversation are not shown."
    return [{"role": "system", "content": preface}] + [
        {"role": line["role"], "content": line["text"][:HISTORY_CHARS]} for line in kept
    ]


def _use_tool(ctx: RunContext, toolbox: dict[str, Tool], call: dict, *, note: str) -> dict:
    """Run one tool call the model asked for; returns what the model is told, and how it went."""
    function = call.get("function") or {}
    name = str(function.get("name") or "")
    raw = function.get("arguments") or ""
    if not isinstance(raw, str):  # some compatible servers send an object
        raw = json.dumps(raw)
    outcome: dict[str, Any] = {
        "id": call.get("id", ""),
        "name": name,
        "arguments": raw,
        "error": False,
    }
    tool_ = toolbox.get(name)
    try:
        if tool_ is None:
            known = ", ".join(toolbox) or "none"
            raise ToolError(f"there is no tool named {name!r} (the tools are: {known})")
        try:
            arguments = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolError(
                f"the arguments of {name} are not valid JSON ({exc.msg} at position {exc.pos})"
            ) from None
        outcome["arguments"] = arguments
        tool_.validate(arguments)
    except ToolError as exc:
        # Deterministic from the recorded assistant message, yet recorded so
        # that the audit trail shows what the model was told.
        told = {"content": f"Error: {exc}", "error": True}
        # The name is the model's text: keep the step name short whatever it sent.
        answer = ctx.step(
            f"Rejecting a call to {name[:80] or 'a tool'}",
            lambda call: told,
            kind="tool",
            kwargs={"call": {"id": outcome["id"], "name": name, "arguments": outcome["arguments"]}},
        )
        return outcome | answer

    if tool_.needs_approval:
        proposal = _proposal(ctx, tool_, arguments, note=note)
        if isinstance(proposal, str):  # the tool's propose refused the call
            told = {"content": f"Error: {proposal}", "error": True}
            answer = ctx.step(
                f"Rejecting a call to {name}",
                lambda call: told,
                kind="tool",
                kwargs={"call": {"id": outcome["id"], "name": name, "arguments": arguments}},
            )
            return outcome | answer
        decision = ctx.approval(f"Approve {name}", proposal=proposal)
        outcome["approved"] = decision.approved
        if not decision.approved:
            reason = f": {decision.comment}" if decision.comment else ""
            who = sentence_start(decision.by_name or "a person")
            outcome |= {
                "error": True,
                "content": f"{who} rejected this call{reason}. Do not retry it.",
            }
            return outcome

    def execute(call: dict) -> Any:
        try:
            value = tool_.invoke(ctx, call["arguments"])
        except ToolError as exc:
            return {"content": f"Error: {exc}", "error": True}
        usage = value if isinstance(value, StepResult) else None
        if usage is not None:
            value = usage.output
        if isinstance(value, str):
            content, content_type = value, "text/plain"
        else:
            content, content_type = (
                json.dumps(value, ensure_ascii=False, default=str),
                "application/json",
            )
        recorded = artifacts.for_the_model(
            run_id=ctx.run_id,
            name=f"{name} output ({call['id']})",
            content=content,
            content_type=content_type,
        )
        if usage is not None:
            return StepResult(recorded, usage.tokens_in, usage.tokens_out, usage.cost_cents)
        return recorded

    answer = ctx.step(
        f"Calling {name}",
        execute,
        kwargs={"call": {"id": outcome["id"], "name": name, "arguments": arguments}},
        kind="tool",
        side_effect=tool_.side_effect,
        idempotency_key=True if tool_.side_effect else None,
        timeout=tool_.timeout,
    )
    return outcome | answer


def _proposal(ctx: RunContext, tool_: Tool, arguments: dict, *, note: str) -> Proposal | str:
    """What the person approving a call of ``tool_`` is shown, or why the call cannot be made.

    With the tool's ``propose`` it is that function's Proposal, worked out in
    a recorded step (it may read the current values from a database or an
    API); without, the call's arguments as changes whose before is unknown.
    Either way the details keep the tool, its arguments and the model's note.
    """
    details = {"tool": tool_.name, "arguments": arguments, "note": note}
    if tool_.propose is None:
        changes = [Change(key, UNKNOWN, value) for key, value in arguments.items()]
        return Proposal(summary=f"Call {tool_.name}", changes=changes, details=details)

    def propose(arguments: dict) -> dict:
        try:
            return {"proposal": tool_.proposal(ctx, arguments).to_json()}
        except ToolError as exc:
            return {"error": str(exc)}

    made = ctx.step(f"Proposing {tool_.name}", propose, arguments, timeout=tool_.timeout)
    if "error" in made:
        return made["error"]
    proposed = Proposal.from_json(made["proposal"])
    return Proposal(
        proposed.summary, proposed.target, proposed.changes, {**proposed.details, **details}
    )


class LiveText:
    """The text of one model call as it comes, shown on the run's live streams as ``model.text`` events.

    An event carries ``iteration``, ``text`` (the text so far, its last
    ``LIVE_TEXT_CHARS`` characters) and ``done``; they go out at most every
    ``LIVE_TEXT_INTERVAL_SECONDS``, and once more with ``done`` true when
    the call ends, whichever way, if it had any text. Showing is best
    effort: an emit that fails is logged, and the call goes on.
    """

    def __init__(
        self, ctx: RunContext, *, iteration: int, clock: Callable[[], float] = time.monotonic
    ):
        self.ctx = ctx
        self.iteration = iteration
        self.clock = clock
        self.text = ""
        self.shown_at: float | None = None

    def __call__(self, delta: str) -> None:
        self.text = (self.text + delta)[-LIVE_TEXT_CHARS:]
        now = self.clock()
        if self.shown_at is None or now - self.shown_at >= LIVE_TEXT_INTERVAL_SECONDS:
            self.shown_at = now
            self._emit(done=False)

    def close(self) -> None:
        if self.text:
            self._emit(done=True)

    def _emit(self, *, done: bool) -> None:
        data = {"iteration": self.iteration, "text": _fitting(self.text), "done": done}
        try:
            self.ctx.emit("model.text", data)
        except Exception:
            logger.debug(
                "could not show the text of model call %s",
                self.iteration,
                exc_info=True,
                extra={"run_id": str(self.ctx.run_id)},
            )


def _accepts_on_text(chat: ChatModel) -> bool:
    try:
        parameters = inspect.signature(chat.complete).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "on_text" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _fitting(text: str) -> str:
    """The end of ``text`` that stays within ``LIVE_TEXT_JSON_BYTES`` as JSON, however it is escaped."""
    # ensure_ascii gives the longest encoding: 6 bytes a character, 12 beyond the BMP.
    size = len(json.dumps(text))
    while size > LIVE_TEXT_JSON_BYTES:
        keep = len(text) * LIVE_TEXT_JSON_BYTES // size
        text = text[len(text) - keep :]
        size = len(json.dumps(text))
    return text


def _output_limit(
    ctx: RunContext, chat: ChatModel, messages: list[dict], specs: list[dict], cap: int
) -> int:
    """Output tokens the next call may use: ``cap``, or fewer when the run's budget cannot pay for them."""
    left = ctx.budget_left_cents
    price = pricing.price_for(chat.model) if left is not None else None
    if left is None or price is None or price.output <= 0:
        return cap
    input_cost = price.input * (pricing.estimate_tokens(messages) + pricing.estimate_tokens(specs))
    affordable = int((left - input_cost) / price.output)
    if affordable < 1:
        raise StopRun(
            "budget",
            f"the run's remaining budget ({left:.6f}¢) cannot pay for another model call "
            f"(about {input_cost:.6f}¢ of input alone)",
        )
    return min(cap, affordable)
