"""The options of ``ctx.step``, checked at the call before anything runs or is written.

A step's options and its function's arguments are two values (``*args`` and
``kwargs=``), never one keyword space, so an option cannot be taken for an
argument of ``fn`` or the other way round. An option the engine cannot honour
is refused here as ``StepOptionTypeError`` / ``StepOptionValueError``: both
are ``Fatal``, so the run fails at once naming the option, instead of a
database constraint refusing the checkpoint after ``fn`` ran (an error the
engine would have taken for its own and retried, running ``fn`` again).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

from workers.errors import StepOptionTypeError, StepOptionValueError

# The kinds agent code may give a step. The other Step kinds (approval,
# message, child, sleep, compensation) are written by the engine's own
# calls, and replay treats them differently (a written-ahead step of a
# waiting kind is not parked), so a plain step must not carry them.
STEP_KINDS = ("llm", "tool", "custom")


@cache
def _column_limits() -> tuple[int, int]:
    from runs.models import Step  # models: loaded after the app registry

    name = Step._meta.get_field("name").max_length
    key = Step._meta.get_field("idempotency_key").max_length
    assert name is not None and key is not None  # both are CharFields, whose max_length is required
    return name, key


def check_step_options(
    name: Any,
    fn: Any,
    kwargs: Any,
    *,
    kind: Any,
    side_effect: Any,
    idempotency_key: Any,
    timeout: Any,
    compensate: Any,
) -> dict[str, Any]:
    """Raise ``StepOptionTypeError``/``StepOptionValueError`` naming the first bad option; return ``fn``'s kwargs."""
    name_max, key_max = _column_limits()
    if not isinstance(name, str):
        raise StepOptionTypeError(
            f"ctx.step() needs the step's name as a string, not {type(name).__name__}"
        )
    where = f"ctx.step({name[:80]!r})"
    if not name.strip():
        raise StepOptionValueError("ctx.step() needs a non-empty step name")
    if len(name) > name_max:
        raise StepOptionValueError(
            f"{where}: name is {len(name)} characters long, at most {name_max} are allowed"
        )
    _callable(fn, "fn", where)
    if kwargs is None:
        kwargs = {}
    elif not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise StepOptionTypeError(
            f"{where}: kwargs= must be a dict of fn's keyword arguments, "
            f"not {type(kwargs).__name__}"
        )
    if not isinstance(kind, str):
        raise StepOptionTypeError(f"{where}: kind= must be a string, not {type(kind).__name__}")
    if kind not in STEP_KINDS:
        allowed = ", ".join(repr(k) for k in STEP_KINDS)
        raise StepOptionValueError(
            f"{where}: unknown kind={kind!r}; a step's kind is one of {allowed}"
        )
    if not isinstance(side_effect, bool):
        raise StepOptionTypeError(
            f"{where}: side_effect= must be True or False, not {type(side_effect).__name__}"
        )
    if idempotency_key is not None and not isinstance(idempotency_key, bool | str):
        raise StepOptionTypeError(
            f"{where}: idempotency_key= must be a string, True or None, "
            f"not {type(idempotency_key).__name__}"
        )
    if isinstance(idempotency_key, str) and not 0 < len(idempotency_key) <= key_max:
        raise StepOptionValueError(
            f"{where}: idempotency_key= must be 1 to {key_max} characters "
            f"(or True for the default key)"
        )
    check_timeout(timeout, where)
    if compensate is not None:
        _callable(compensate, "compensate", where)
    return dict(kwargs)


def check_timeout(timeout: Any, where: str) -> None:
    """A step timeout is None (the kind's) or a positive, finite number of seconds."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise StepOptionTypeError(
            f"{where}: timeout= must be a number of seconds, not {type(timeout).__name__}"
        )
    if not math.isfinite(timeout) or timeout <= 0:
        raise StepOptionValueError(
            f"{where}: timeout={timeout!r} must be a positive, finite number of seconds"
        )


def _callable(value: Any, option: str, where: str) -> Callable[..., Any]:
    if not callable(value):
        raise StepOptionTypeError(
            f"{where}: {option}= must be callable, not {type(value).__name__}"
        )
    return value
