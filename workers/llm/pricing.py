"""What a model call costs: a per-model price table, overridable in settings.

Prices are US dollars per million tokens, as providers publish them:
``{"gpt-4o-mini": {"input": 0.15, "output": 0.60}}``. ``RUNS_LLM_PRICES``
(a Django setting, or JSON in the environment variable of that name) is
merged over the defaults below. A model name matches the longest entry it
starts with, so ``gpt-4o-mini-2024-07-18`` is priced as ``gpt-4o-mini``. A
model with no price costs nothing (and is logged once), so set prices for
the models you use when runs have cost ceilings.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from workers.llm import conf

logger = logging.getLogger(__name__)

# Indicative list prices; deployments set their own in RUNS_LLM_PRICES.
DEFAULT_PRICES: dict[str, dict[str, float]] = {
    "gpt-4o-mini": {"input": 0.15, "output": 0.60},
    "gpt-4o": {"input": 2.50, "output": 10.00},
    "gpt-4.1-nano": {"input": 0.10, "output": 0.40},
    "gpt-4.1-mini": {"input": 0.40, "output": 1.60},
    "gpt-4.1": {"input": 2.00, "output": 8.00},
    "o4-mini": {"input": 1.10, "output": 4.40},
    "claude-3-5-haiku": {"input": 0.80, "output": 4.00},
    "claude-haiku-4-5": {"input": 1.00, "output": 5.00},
    "claude-sonnet-4": {"input": 3.00, "output": 15.00},
    "claude-opus-4": {"input": 15.00, "output": 75.00},
    # The offline scripted model is priced like a small hosted model, so
    # the dashboard shows what such a run would cost.
    "scripted": {"input": 0.15, "output": 0.60},
}

SIX_PLACES = Decimal("0.000001")
_warned: set[str] = set()


@dataclass(frozen=True)
class Price:
    """A model's price in cents per token."""

    input: Decimal
    output: Decimal

    def cost_cents(self, tokens_in: int, tokens_out: int) -> Decimal:
        cost = self.input * tokens_in + self.output * tokens_out
        return cost.quantize(SIX_PLACES, rounding=ROUND_HALF_UP)


def prices() -> dict[str, dict[str, float]]:
    overrides = conf.get("RUNS_LLM_PRICES") or {}
    if isinstance(overrides, str):
        overrides = json.loads(overrides)
    return {**DEFAULT_PRICES, **overrides}


def price_for(model: str, *, warn: bool = True) -> Price | None:
    """The price of ``model`` (longest matching prefix in the table), or None if it has none."""
    table = prices()
    matches = [name for name in table if model and model.startswith(name)]
    if not matches:
        if warn and model not in _warned:
            _warned.add(model)
            logger.warning(
                "no price for model %r: its calls are recorded at 0 cents (set RUNS_LLM_PRICES)",
                model,
            )
        return None
    entry = table[max(matches, key=len)]
    per_token = Decimal(100) / Decimal(1_000_000)  # dollars per million tokens -> cents per token
    return Price(
        input=Decimal(str(entry.get("input", 0))) * per_token,
        output=Decimal(str(entry.get("output", 0))) * per_token,
    )


def cost_cents(model: str, tokens_in: int, tokens_out: int, *, fallback: str = "") -> Decimal:
    """Cents a call cost, from the provider's token counts; ``fallback`` is the requested model's name."""
    price = price_for(model, warn=False)
    if price is None:
        price = price_for(fallback or model)
    return price.cost_cents(tokens_in, tokens_out) if price else Decimal(0)


def estimate_tokens(data: object) -> int:
    """A rough token count (4 characters a token) of JSON-able data, for budgets and the scripted model."""
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, default=str)
    return max(1, (len(text) + 3) // 4)
