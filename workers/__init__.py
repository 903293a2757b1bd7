"""The execution layer and the agent authoring API.

    from workers import agent, RunContext, StepResult, Retryable, Fatal, Ambiguous
"""

from workers.context import RunContext, StepResult
from workers.errors import Ambiguous, Fatal, Retryable
from workers.registry import agent

__all__ = ["agent", "RunContext", "StepResult", "Retryable", "Fatal", "Ambiguous"]
