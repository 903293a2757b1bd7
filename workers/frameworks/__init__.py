"""Adapters that give agents written with a framework this engine's guarantees.

Each is an optional extra: ``agentruns[pydantic-ai]`` (``workers.frameworks.pydantic_ai``)
and ``agentruns[openai-agents]`` (``workers.frameworks.openai_agents``). Inside one of
our kinds, the framework's model requests and tool calls become checkpointed steps,
replayed after a crash instead of being called again, and its approval-requiring
tools become ``ctx.approval``. Both run their framework's coroutines on one event loop
per worker process while the run's own thread makes the steps (``workers.frameworks.bridge``).
"""
