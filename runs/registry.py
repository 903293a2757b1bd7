"""The ``@agent`` registry.

Kinds are discovered from installed apps' ``agents.py`` and from every module
named in ``AGENT_MODULES``; the web process and the worker import the same
modules, so both know the same kinds and input schemas.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from runs.exceptions import InvalidAgentInput

if TYPE_CHECKING:
    from pydantic import BaseModel

# What a queue may be called (the worker's --queues, a kind's queue, a task backend's QUEUES).
QUEUE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")

_registry: dict[str, AgentKind] = {}
_declared_queues: set[str] = set()

# The errors a run can fail on for good while a worker holds it, and so roll back on.
COMPENSABLE_ERRORS = frozenset(
    {"fatal", "retryable", "budget", "deadline", "step_limit", "nondeterministic"}
)


@dataclass(frozen=True)
class AgentKind:
    name: str
    func: Callable[..., Any]
    queue: str = "default"
    input_schema: type[BaseModel] | None = None
    max_attempts: int | None = None
    cost_ceiling_cents: float | None = None
    deadline: timedelta | None = None
    version: int = 1
    resumes_versions: frozenset[int] = field(default_factory=frozenset)
    step_timeout: float | None = None
    max_steps: int = 200
    max_model_iterations: int = 25
    backoff_base: float | None = None
    backoff_cap: float | None = None
    compensate_on: frozenset[str] = field(default_factory=frozenset)
    description: str = ""
    # Whether a tenant may start it through the API and the dashboard (runs.kinds): False for a task
    # kind and an engine kind, which only code starts (submit_run, ctx.spawn, Django's task API).
    public: bool = True
    # How a run's title is made from its input (runs.titles): a callable of the input dict, an input
    # field's name, or None for the first string field.
    title: Callable[[dict], str] | str | None = None
    # Called in the worker after the exit that ends one of its runs committed (done, failed or
    # cancelled there): ``after_exit(ctx, status, result, at)``, ``result`` the stored result or None,
    # ``at`` the exit's time (the database's clock).
    # The django.tasks backend sends Django's task_finished from it (runs.tasks).
    after_exit: Callable[[Any, str, Any, Any], None] | None = None

    def validate_input(self, data: Any) -> Any:
        """Return the normalised JSON input; raise InvalidAgentInput when it does not validate."""
        if self.input_schema is None:
            if not isinstance(data, dict):
                raise InvalidAgentInput("input must be a JSON object")
            return data
        from pydantic import ValidationError

        try:
            model = self.input_schema.model_validate(data)
        except ValidationError as exc:
            errors = [
                {"loc": list(err["loc"]), "msg": err["msg"], "type": err["type"]}
                for err in exc.errors(include_url=False, include_context=False)
            ]
            first = errors[0]
            where = ".".join(str(p) for p in first["loc"]) or "input"
            raise InvalidAgentInput(
                f"invalid input for kind {self.name!r}: {where}: {first['msg']}", errors
            ) from None
        return model.model_dump(mode="json")

    def agent_input(self, stored: Any) -> Any:
        """The argument the agent function receives: the schema instance, or the dict."""
        if self.input_schema is None:
            return stored
        return self.input_schema.model_validate(stored)

    def input_json_schema(self) -> dict:
        if self.input_schema is None:
            return {"type": "object"}
        return self.input_schema.model_json_schema()

    def can_resume(self, recorded_version: int | None) -> bool:
        return (
            recorded_version is None
            or recorded_version == self.version
            or recorded_version in self.resumes_versions
        )


def agent(
    name: str,
    *,
    queue: str = "default",
    input_schema: type[BaseModel] | None = None,
    max_attempts: int | None = None,
    cost_ceiling_cents: float | None = None,
    deadline: timedelta | None = None,
    version: int = 1,
    resumes_versions: tuple[int, ...] = (),
    step_timeout: float | None = None,
    max_steps: int = 200,
    max_model_iterations: int = 25,
    backoff_base: float | None = None,
    backoff_cap: float | None = None,
    compensate_on: tuple[str, ...] = (),
    title: Callable[[dict], str] | str | None = None,
    public: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a function ``fn(ctx, input)`` as the agent kind ``name``.

    ``input_schema`` is a pydantic model the submitted input must validate
    against (the function then receives an instance of it); ``queue`` is the
    default queue of its runs; ``max_attempts``, ``cost_ceiling_cents`` and
    ``deadline`` are per-kind defaults a submit may override; ``version`` is
    recorded on each run at first claim, and ``resumes_versions`` lists older
    versions whose runs this code can still resume. ``step_timeout`` (seconds,
    default RUNS_STEP_TIMEOUT_SECONDS) bounds each step unless the step says
    otherwise; ``max_steps`` and ``max_model_iterations`` (steps of kind
    ``llm``) bound a run (``step_limit``); ``backoff_base`` and
    ``backoff_cap`` override RUNS_BACKOFF_BASE_SECONDS / _CAP_SECONDS.
    ``compensate_on`` lists the errors on which a run that fails for good
    rolls back its finished steps that have a ``compensate=`` (a saga):
    ``fatal``, ``retryable`` (its retry budget spent), ``budget``,
    ``deadline``, ``step_limit``, ``nondeterministic``. Without it a failed
    run keeps its completed work.

    ``title`` says how each run is named in lists, from its validated input
    (a dict): a function ``title(input) -> str`` (if it raises, the run is
    still queued, with the default title), or the name of an input field.
    By default the title is the input's first string field. Titles are one
    line of at most 200 characters, and searchable (``GET /api/runs?q=``).

    ``public=False`` keeps the kind from tenants: ``POST /api/runs``, a fork
    and the dashboard's form refuse it as an unknown kind and ``/api/kinds``
    leaves it out, while code still starts it (``submit_run``, ``ctx.spawn``).
    """
    unknown = set(compensate_on) - COMPENSABLE_ERRORS
    if unknown:
        raise ValueError(
            f"compensate_on: unknown error kinds {sorted(unknown)}; use {sorted(COMPENSABLE_ERRORS)}"
        )
    if not (title is None or callable(title) or (isinstance(title, str) and title)):
        raise TypeError(
            f"title must be a function of the input, the name of an input field, or None; not {title!r}"
        )

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        register(
            AgentKind(
                name=name,
                func=func,
                queue=queue,
                input_schema=input_schema,
                max_attempts=max_attempts,
                cost_ceiling_cents=cost_ceiling_cents,
                deadline=deadline,
                version=version,
                resumes_versions=frozenset(resumes_versions),
                step_timeout=step_timeout,
                max_steps=max_steps,
                max_model_iterations=max_model_iterations,
                backoff_base=backoff_base,
                backoff_cap=backoff_cap,
                compensate_on=frozenset(compensate_on),
                description=inspect.cleandoc(func.__doc__ or ""),
                title=title,
                public=public,
            )
        )
        return func

    return decorator


def register(kind: AgentKind) -> AgentKind:
    """Register a kind: what ``@agent`` does, for kinds built by code (the django.tasks backend's).

    Registering the same name again replaces the entry only if it runs the same function (the same
    object, or one of the same dotted name: a module imported twice).
    """
    existing = _registry.get(kind.name)
    if (
        existing is not None
        and existing.func is not kind.func
        and _qualname(existing.func) != _qualname(kind.func)
    ):
        raise ValueError(
            f"agent kind {kind.name!r} is registered twice ({_qualname(existing.func)} and {_qualname(kind.func)})"
        )
    _registry[kind.name] = kind
    return kind


def declare_queues(names: Iterable[str]) -> None:
    """Queues runs may be submitted to although no kind uses them by default (a task backend's QUEUES)."""
    _declared_queues.update(names)


def declared_queues() -> frozenset[str]:
    return frozenset(_declared_queues)


def _qualname(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def get_kind(name: str) -> AgentKind | None:
    return _registry.get(name)


def all_kinds() -> list[AgentKind]:
    return sorted(_registry.values(), key=lambda k: k.name)


def autodiscover() -> None:
    from django.conf import settings
    from django.utils.module_loading import autodiscover_modules

    autodiscover_modules("agents")
    for module in settings.AGENT_MODULES:
        importlib.import_module(module)
