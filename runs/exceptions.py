"""Domain errors; the API maps each to one HTTP answer (config/api.py)."""


class RunsError(Exception):
    """Base class; ``str(exc)`` is a readable sentence for the client."""


class UnknownKind(RunsError):
    pass


class InvalidRunInput(RunsError, ValueError):
    def __init__(self, message: str, errors: list | None = None):
        super().__init__(message)
        self.errors = errors or []


class InvalidAgentInput(RunsError):
    """The input does not validate against the kind's input schema."""

    def __init__(self, message: str, errors: list | None = None):
        super().__init__(message)
        self.errors = errors or []


class IdempotencyConflict(RunsError):
    pass


class InvalidTransition(RunsError):
    pass


class QueueFull(RunsError):
    def __init__(self, message: str, retry_after: int = 5):
        super().__init__(message)
        self.retry_after = retry_after
