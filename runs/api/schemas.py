"""Input and output schemas of the JSON API (fields listed explicitly)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from ninja import Schema
from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from runs.errors import tenant_error
from runs.limits import CENTS_LIMIT, MAX_DEADLINE_SECONDS, MAX_EXPIRES_IN_SECONDS
from runs.text import find_unstorable


class StorableIn(Schema):
    """Base of every input schema: a value PostgreSQL cannot store is a 422 naming the field.

    NUL characters and lone surrogates in any text or key, NaN and infinity,
    nesting deeper than ``runs.text.MAX_DEPTH`` (see ``runs.text``). One
    validator for all fields, so a field added later is covered too.
    """

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        where = (field.alias if field else None) or info.field_name or "value"
        if problem := find_unstorable(value, where=where):
            # The problem names the field already; the API's handler shows it as it is.
            raise PydanticCustomError("unstorable", "{problem}", {"problem": problem})
        return value


class RunIn(StorableIn):
    kind: str = Field(min_length=1, max_length=100)
    input: dict[str, Any] = Field(default_factory=dict)
    queue: str | None = Field(default=None, max_length=64)
    # Strict: "priority": true or "5" is a client bug worth a 422, not a silent 1 or 5.
    priority: int | None = Field(default=None, ge=0, le=9, strict=True)
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=255)
    max_attempts: int | None = Field(default=None, ge=1, le=100, strict=True)
    cost_ceiling_cents: float | None = Field(
        default=None, ge=0, lt=CENTS_LIMIT, allow_inf_nan=False
    )
    deadline_seconds: int | None = Field(default=None, ge=1, le=MAX_DEADLINE_SECONDS, strict=True)
    expires_in: int | None = Field(
        default=None,
        ge=1,
        le=MAX_EXPIRES_IN_SECONDS,
        strict=True,
        description="seconds: a run not started by then is never started and fails expired",
    )
    concurrency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description="at most one active run per key of the tenant (one live run per lead)",
    )
    on_conflict: Literal["enqueue", "reject", "cancel_running", "cancel_running_with_rollback"] = (
        Field(
            default="enqueue",
            description="when a run of the key is live: wait for it (enqueue), 409 naming it "
            "(reject), or cancel it at its next step boundary, with or without rolling back "
            "its finished steps, and start after it",
        )
    )
    callback_url: str | None = Field(default=None, max_length=2000)


class SubmitHeaders(StorableIn):
    idempotency_key: str | None = Field(
        default=None, alias="Idempotency-Key", min_length=1, max_length=255
    )


class RunOut(Schema):
    id: UUID
    kind: str
    title: str = Field(
        description="a few words from the input telling the run apart (the kind's title=)"
    )
    queue: str
    priority: int
    status: str
    current_step: str
    steps_done: int
    steps_total: int | None
    attempt: int
    max_attempts: int
    cost_cents: float
    cost_ceiling_cents: float | None
    result: Any = None
    error: str
    error_kind: str
    outcome: str = Field(
        description="what the agent reported it achieved: succeeded, unchanged, partial, "
        "or '' when it did not say (ctx.report)"
    )
    summary: str = Field(
        description="the agent's one-line account of what it did ('' when it did not say)"
    )
    waiting_for: Any = None
    cancel_requested: bool
    pause_requested: bool
    parent_id: UUID | None
    thread_id: UUID | None = Field(description="the thread this run is a turn of, if any")
    turn: int | None = Field(description="its number among the thread's turns")
    children_pending: int
    children_cost_cents: float
    origin_id: UUID | None
    origin_step: int | None
    compensation: str = Field(description="'' (no rollback), requested, running, done or partial")
    compensated: bool = Field(
        description="true when a rollback undid every finished step it had to"
    )
    run_after: datetime
    concurrency_key: str | None = Field(description="its concurrency key, if it was given one")
    schedule_id: UUID | None = Field(description="the schedule whose fire submitted it, if any")
    start_by: datetime | None = Field(
        description="when a run that has not started expires (expires_in), or null"
    )
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime

    @staticmethod
    def resolve_error(run) -> str:
        return tenant_error(run.error)

    @staticmethod
    def resolve_waiting_for(run) -> Any:
        from runs.selectors import waiting_for

        waiting = waiting_for(run)
        if waiting and waiting.get("error"):
            waiting["error"] = tenant_error(waiting["error"])
        return waiting

    @staticmethod
    def resolve_cancel_requested(run) -> bool:
        return run.cancel_requested_at is not None

    @staticmethod
    def resolve_pause_requested(run) -> bool:
        return run.pause_requested_at is not None

    @staticmethod
    def resolve_compensated(run) -> bool:
        return run.compensation == "done"


class RunPage(Schema):
    items: list[RunOut]
    next_cursor: str | None


class StepOut(Schema):
    seq: int
    generation: int
    name: str
    kind: str
    status: str
    input: Any = None
    output: Any = None
    idempotency_key: str
    tokens_in: int
    tokens_out: int
    cost_cents: float
    executions: int
    error: str
    text_replaced: bool
    started_at: datetime | None
    ended_at: datetime | None

    @staticmethod
    def resolve_error(step) -> str:
        return tenant_error(step.error)


class StepPage(Schema):
    items: list[StepOut]
    next_cursor: str | None


class KindOut(Schema):
    name: str
    queue: str
    version: int
    description: str
    input_schema: dict[str, Any]


class HealthOut(Schema):
    status: str


class ErrorOut(Schema):
    detail: str


class DecisionIn(StorableIn):
    comment: str = Field(default="", max_length=5000)
    step: int | None = Field(
        default=None,
        ge=1,
        description="the pending approval's step number; 409 if another is pending",
    )


class MessageIn(StorableIn):
    text: str = Field(min_length=1, max_length=20000)


class CancelIn(StorableIn):
    compensate: bool = Field(
        default=False, strict=True, description="roll back the finished steps first (a saga)"
    )


class ForkIn(StorableIn):
    from_step: int = Field(
        ge=1, le=1_000_000, strict=True, description="steps before it are copied as done"
    )


class ResolveIn(StorableIn):
    action: Literal["done", "retry", "fail", "skip"]
    output: Any = None


class RetryIn(StorableIn):
    from_step: int | None = Field(default=None, ge=1)
    deadline_seconds: int | None = Field(default=None, ge=1, le=MAX_DEADLINE_SECONDS)
    cost_ceiling_cents: float | None = Field(
        default=None, ge=0, lt=CENTS_LIMIT, allow_inf_nan=False
    )
