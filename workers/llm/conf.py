"""Settings of the LLM runtime, read when used (so tests and deployments can override them).

Each value comes from the Django setting of the same name when it exists,
else from the environment variable of that name, else the default here.
"""

from __future__ import annotations

import json
import os
from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    "LLM_BASE_URL": "",
    "LLM_API_KEY": "",
    "LLM_MODEL": "",
    # openai | anthropic | scripted; empty: openai when LLM_BASE_URL is set, else scripted.
    "LLM_PROVIDER": "",
    # Output tokens asked for per model call when the budget allows more.
    "LLM_MAX_OUTPUT_TOKENS": 4096,
    # Tool output larger than this (bytes, UTF-8) is stored as an Artifact.
    "RUNS_ARTIFACT_THRESHOLD_BYTES": 8192,
    # How much of an artifact the model sees (characters).
    "RUNS_ARTIFACT_EXCERPT_CHARS": 1200,
    # Per-model prices, merged over workers.llm.pricing.DEFAULT_PRICES.
    "RUNS_LLM_PRICES": {},
}

_JSON = {"RUNS_LLM_PRICES"}


def get(name: str) -> Any:
    """The value of one setting of the LLM runtime (Django setting, then environment, then default)."""
    if hasattr(settings, name):
        return getattr(settings, name)
    default = DEFAULTS[name]
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if name in _JSON:
        return json.loads(raw)
    if isinstance(default, int):
        return int(raw)
    return raw


def provider() -> str:
    """Which provider drives runs that start now: ``openai``, ``anthropic`` or ``scripted``."""
    explicit = (get("LLM_PROVIDER") or "").strip().lower()
    if explicit:
        return explicit
    base_url = get("LLM_BASE_URL") or ""
    if not base_url:
        return "scripted"
    return "anthropic" if "anthropic.com" in base_url else "openai"
