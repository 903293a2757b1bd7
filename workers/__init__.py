"""The execution layer and the agent authoring API.

from workers import agent, RunContext, StepResult, Retryable, Fatal, Ambiguous
"""

from runs.registry import agent
from runs.states import RunOutcome
from workers.context import RunContext
from workers.errors import Ambiguous, Fatal, InvalidStepOption, Retryable
from workers.proposals import Change, Proposal
from workers.values import Decision, StepResult

__all__ = [
    "agent",
    "RunContext",
    "StepResult",
    "Decision",
    "Retryable",
    "Fatal",
    "Ambiguous",
    "Proposal",
    "Change",
    "RunOutcome",
    "InvalidStepOption",
]
