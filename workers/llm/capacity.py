"""A model call under the rate limit that applies to it (runs.engine.ratelimits), inside its step.

The LLM loop and both framework adapters call the model through
``model_call``: before the request is sent, one request and its estimated
tokens (the prompt's estimate plus the output cap) are reserved under the
first limit that exists of ``llm:<provider>:<model>``, ``llm:<provider>``
and ``llm``; when it answers, its reported usage settles the reservation.
No room: ``AwaitCapacity``, and the run goes back to the queue until there
is (the step was not recorded, so it runs then). A 429 from the provider
pauses the key for every worker for its ``Retry-After`` (at least a
second) and gives the run back the same way, without counting a failure.
With no limit for the call, nothing is reserved, and a 429 is a retryable
error as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from runs.db import release_connection
from runs.engine import ratelimits
from workers.classify import classify
from workers.errors import AwaitCapacity, Fatal
from workers.llm.pricing import estimate_tokens


@dataclass
class CallUsage:
    """What the call reported, set by the caller once it answered."""

    tokens: int | None = None


def limit_keys(provider: str, model: str) -> list[str]:
    """The keys a model call is limited by, most specific first (the first that exists applies)."""
    keys = [f"llm:{provider}:{model}", f"llm:{provider}"] if provider else [f"llm:{model}"]
    return [*keys, "llm"]


@contextmanager
def model_call(
    ctx: Any, *, provider: str, model: str, prompt: Any, max_tokens: int | None
) -> Iterator[CallUsage]:
    """Reserve the call's capacity, yield, then settle it with ``CallUsage.tokens`` (see the module)."""
    estimate = estimate_tokens(prompt) + (max_tokens or 0)
    try:
        got = ratelimits.reserve(
            limit_keys(provider, model), tenant_id=ctx.tenant_id, run_id=ctx.run_id, tokens=estimate
        )
    except ratelimits.NeverEnough as exc:
        raise Fatal(str(exc)) from None
    finally:
        release_connection()  # never held while the model thinks
    if isinstance(got, ratelimits.Denied):
        raise AwaitCapacity(key=got.key, until=got.until)
    usage = CallUsage()
    try:
        yield usage
    except BaseException as exc:
        if got.id is None:
            raise
        # The call may have reached the provider: it counts, as reserved, from now.
        ratelimits.settle(got.id, tokens=estimate)
        if got.key is None or classify(exc).status_code != 429:
            release_connection()
            raise
        # The provider said to wait: every worker's calls under the key wait as it asked.
        until = ratelimits.pause(got.key, seconds=max(1.0, classify(exc).retry_after or 1.0))
        release_connection()
        if until is None:
            raise
        raise AwaitCapacity(key=got.key, until=until) from exc
    if got.id is not None:
        ratelimits.settle(got.id, tokens=estimate if usage.tokens is None else usage.tokens)
        release_connection()
