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


class PayloadTooLarge(InvalidRunInput):
    """A value past ``RUNS_PAYLOAD_MAX_BYTES`` of JSON (``runs.payloads``): refused before anything is written."""

    def __init__(self, message: str, *, size: int, limit: int):
        super().__init__(message)
        self.size = size
        self.limit = limit
