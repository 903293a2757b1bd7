"""Tools a model may call: plain functions declared with ``@tool``.

The decorator reads the function's signature: each parameter's type hint
(plain types, ``Literal``, pydantic models...) and default become the JSON
schema the model sees, and the first paragraph of the docstring becomes the
tool's description. The model's arguments are validated against the same
schema before the tool runs; invalid arguments are answered to the model as
a tool error and the tool is not called.

A tool that needs its run (for ``ctx.idempotency_key``, say) declares a
first parameter ``ctx``; it is passed by the loop and is not part of the
schema.

A tool that ``needs_approval`` may say what a call would change with
``propose=fn``: ``fn`` takes the tool's arguments (and ``ctx`` first if it
declares it) and returns a ``Proposal`` with the current values as
``before``, read in a recorded step so that replay reads nothing again.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from workers.proposals import Proposal


class ToolError(Exception):
    """Raise in a tool to answer the model with an error it can act on (the run goes on)."""


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its JSON schema and how the loop must treat it."""

    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict
    arguments_model: type[BaseModel]
    side_effect: bool = False
    needs_approval: bool = False
    takes_ctx: bool = False
    timeout: float | None = None
    propose: Callable[..., Proposal] | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def spec(self) -> dict:
        """The tool as the OpenAI Chat Completions ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def validate(self, arguments: Any) -> dict:
        """The model's arguments checked against the schema; raises ToolError with a readable reason."""
        if not isinstance(arguments, dict):
            raise ToolError(
                f"the arguments of {self.name} must be a JSON object, not {type(arguments).__name__}"
            )
        try:
            model = self.arguments_model.model_validate(arguments)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
                for err in exc.errors(include_url=False)
            )
            raise ToolError(f"invalid arguments for {self.name}: {problems}") from None
        # Keep nested models as models: the function's hints ask for them.
        return {name: getattr(model, name) for name in type(model).model_fields}

    def invoke(self, ctx: Any, arguments: dict) -> Any:
        """Validate ``arguments`` and call the function (with ``ctx`` first when it asks for it)."""
        values = self.validate(arguments)
        return self.fn(ctx, **values) if self.takes_ctx else self.fn(**values)

    def proposal(self, ctx: Any, arguments: dict) -> Proposal:
        """What a call with ``arguments`` would change, from ``propose`` (a ToolError means it cannot be made)."""
        if self.propose is None:
            raise TypeError(f"tool {self.name} has no propose function")
        values = self.validate(arguments)
        proposed = (
            self.propose(ctx, **values) if _takes_ctx(self.propose) else self.propose(**values)
        )
        if not isinstance(proposed, Proposal):
            raise TypeError(
                f"the propose function of tool {self.name} returned {type(proposed).__name__}, not a Proposal"
            )
        return proposed


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effect: bool = False,
    needs_approval: bool = False,
    timeout: float | None = None,
    propose: Callable[..., Proposal] | None = None,
) -> Any:
    """Declare a function as a tool for ``run_agent_loop``; use bare or with options.

    ``name`` defaults to the function's name and ``description`` to the
    first paragraph of its docstring. ``side_effect=True`` makes each call a
    write-ahead step with an idempotency key (``ctx.idempotency_key``, to
    pass to the system the tool writes to), so a crash re-executes it with
    the same key and never repeats the effect without it.
    ``needs_approval=True`` asks a person (``ctx.approval``) before each call;
    a rejection is answered to the model. ``propose=fn`` describes each
    call to that person: ``fn`` takes the tool's arguments (and ``ctx``
    first if it declares it) and returns a ``Proposal`` with before and
    after values; the loop calls it in a recorded step (``"Proposing <tool>"``),
    so it may read the database or an API, and a ``ToolError`` it raises is
    answered to the model without asking anyone. Without it, the proposal
    lists the call's arguments. ``timeout`` (seconds) overrides the kind's
    step timeout for this tool (and for its ``propose``).

        def describe(lead_id: int, stage: str) -> Proposal:
            lead = crm.get(lead_id)
            return Proposal(f"Update lead {lead.name}", changes=[Change("stage", lead.stage, stage)])

        @tool(side_effect=True, needs_approval=True, propose=describe)
        def update_lead(ctx, lead_id: int, stage: Literal["won", "lost"]) -> dict:
            \"\"\"Change a lead's stage.\"\"\"
            return crm.update(lead_id, stage, idempotency_key=ctx.idempotency_key)
    """
    if propose is not None and not needs_approval:
        raise TypeError(
            "propose= describes a call to the person who approves it: give needs_approval=True too"
        )

    def decorate(func: Callable[..., Any]) -> Tool:
        model, takes_ctx = _arguments_model(func)
        schema = model.model_json_schema()
        schema.pop("title", None)
        return Tool(
            name=name or func.__name__,
            fn=func,
            description=description or _first_paragraph(func.__doc__) or (name or func.__name__),
            parameters=schema,
            arguments_model=model,
            side_effect=side_effect,
            needs_approval=needs_approval,
            takes_ctx=takes_ctx,
            timeout=timeout,
            propose=propose,
        )

    return decorate(fn) if fn is not None else decorate


def _arguments_model(func: Callable[..., Any]) -> tuple[type[BaseModel], bool]:
    signature = inspect.signature(func)
    from workers.context import RunContext

    # RunContext is often imported for type checking only: resolve it anyway.
    hints = get_type_hints(func, localns={"RunContext": RunContext}, include_extras=True)
    params = list(signature.parameters.values())
    takes_ctx = _takes_ctx(func, hints)
    if takes_ctx:
        params = params[1:]
    fields: dict[str, Any] = {}
    for param in params:
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(
                f"tool {func.__name__}: *args and **kwargs cannot be described to a model"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, default)
    model = create_model(
        f"{func.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    return model, takes_ctx


def _takes_ctx(func: Callable[..., Any], hints: dict | None = None) -> bool:
    """Whether ``func``'s first parameter is the run's context (named ``ctx`` or annotated ``RunContext``)."""
    params = list(inspect.signature(func).parameters.values())
    if not params:
        return False
    if params[0].name == "ctx":
        return True
    annotation = params[0].annotation if hints is None else hints.get(params[0].name)
    return _is_run_context(annotation) or annotation == "RunContext"


def _is_run_context(annotation: Any) -> bool:
    return getattr(annotation, "__name__", "") == "RunContext"


def _first_paragraph(doc: str | None) -> str:
    return inspect.cleandoc(doc or "").split("\n\n")[0].replace("\n", " ").strip()
