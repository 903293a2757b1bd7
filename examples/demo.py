"""A support conversation in the demo tenant, so that `make run` shows a thread on the Threads page."""

from __future__ import annotations

from typing import Any

from runs.events import Actor

DEMO_THREAD_KEY = "demo-support-thread"


def add_demo_thread(sender: Any = None, *, tenant, **kwargs: Any) -> None:
    """The receiver of ``runs.seed.demo_seeded``: one ``support_assistant`` thread, once (by its key).

    Its first message wakes it: the worker `make run` starts plays turn 1,
    and the conversation goes on from the dashboard.
    """
    from runs.threads import create_thread

    create_thread(
        tenant=tenant,
        kind="support_assistant",
        actor=Actor(type="system", id="demo"),
        title="Duplicate charge on my invoice",
        policy="enqueue",
        idempotency_key=DEMO_THREAD_KEY,
        message="Hello! How do retries and backoff work when a model call fails?",
    )
