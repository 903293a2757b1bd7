"""The execution layer and the agent authoring API.

    from workers import agent, RunContext, StepResult, Retryable, Fatal, Ambiguous
"""

from workers.context import Decision, RunContext, StepResult
from workers.errors import Ambiguous, Fatal, Retryable
from workers.registry import agent

__all__ = ["agent", "RunContext", "StepResult", "Decision", "Retryable", "Fatal", "Ambiguous"]
