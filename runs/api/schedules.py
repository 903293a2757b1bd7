"""Schedule endpoints of the runs Router: create, list, read, change and delete (see runs.schedules)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.http import Http404, HttpResponse
from django.utils import timezone as django_timezone
from ninja import Query, Schema, Status
from pydantic import Field, StrictBool

from runs import kinds
from runs.api.auth import ApiRequest
from runs.api.endpoints import ERRORS, require_scope, router
from runs.api.schemas import StorableIn
from runs.models import ApiKey, CatchUp, Overlap, Schedule
from runs.schedules import MAX_EVERY_SECONDS, arm, check_cadence
from runs.services import validated_input


class ScheduleIn(StorableIn):
    kind: str = Field(min_length=1, max_length=100)
    input: dict[str, Any] = Field(default_factory=dict)
    name: str = Field(default="", max_length=200)
    cron: str | None = Field(
        default=None, min_length=1, max_length=120, description="five-field cron, e.g. '0 9 * * 1'"
    )
    every_seconds: int | None = Field(default=None, ge=1, le=MAX_EVERY_SECONDS, strict=True)
    timezone: str = Field(default="UTC", min_length=1, max_length=64)
    overlap: Overlap = Field(
        default=Overlap.SKIP,
        description="while its previous run is live: skip, enqueue, cancel_running or allow",
    )
    catch_up: CatchUp = Field(
        default=CatchUp.ONE, description="fire times missed while down: one, none or all"
    )
    enabled: StrictBool = True


class SchedulePatch(StorableIn):
    input: dict[str, Any] | None = None
    name: str | None = Field(default=None, max_length=200)
    cron: str | None = Field(default=None, min_length=1, max_length=120)
    every_seconds: int | None = Field(default=None, ge=1, le=MAX_EVERY_SECONDS, strict=True)
    timezone: str | None = Field(default=None, min_length=1, max_length=64)
    overlap: Overlap | None = None
    catch_up: CatchUp | None = None
    enabled: StrictBool | None = None


class ScheduleOut(Schema):
    id: UUID
    name: str
    kind: str
    input: Any
    cron: str | None
    every_seconds: int | None
    timezone: str
    overlap: str
    catch_up: str
    enabled: bool
    next_fire_at: datetime | None
    last_fired_at: datetime | None
    fires: int = Field(description="runs it submitted")
    missed: int = Field(description="fire times that made no run (see last_error)")
    last_error: str
    created_at: datetime
    updated_at: datetime

    @staticmethod
    def resolve_cron(schedule: Schedule) -> str | None:
        return schedule.cron or None


class SchedulePage(Schema):
    items: list[ScheduleOut]


class ScheduleFilters(StorableIn):
    kind: str | None = Field(default=None, max_length=100)
    enabled: StrictBool | None = None
    limit: int = Field(default=100, ge=1, le=500)


def _validated_input(kind: str, data: dict[str, Any]) -> Any:
    return validated_input(kind, data)[1]


def _schedule(request: ApiRequest, schedule_id: UUID, *, lock: bool = False) -> Schedule:
    found = Schedule.objects.filter(tenant=request.auth.tenant, pk=schedule_id)
    schedule = (found.select_for_update() if lock else found).first()
    if schedule is None:
        raise Http404("no such schedule")
    return schedule


@router.post(
    "/schedules", response={201: ScheduleOut} | ERRORS, summary="Submit a kind on a schedule"
)
def create_schedule(request: ApiRequest, response: HttpResponse, payload: ScheduleIn):
    require_scope(request, ApiKey.Scope.WRITE)
    kinds.require_startable(request.auth.tenant, payload.kind)
    cadence = check_cadence(
        cron=payload.cron, every_seconds=payload.every_seconds, timezone=payload.timezone
    )
    schedule = Schedule(
        tenant=request.auth.tenant,
        name=payload.name,
        kind=payload.kind,
        input=_validated_input(payload.kind, payload.input),
        cron=cadence.cron,
        every_seconds=cadence.every_seconds,
        timezone=cadence.timezone,
        overlap=payload.overlap,
        catch_up=payload.catch_up,
        enabled=payload.enabled,
    )
    arm(schedule)
    schedule.save()
    response["Location"] = f"/api/schedules/{schedule.pk}"
    return Status(201, schedule)


@router.get("/schedules", response={200: SchedulePage} | ERRORS, summary="The tenant's schedules")
def list_schedules(request: ApiRequest, filters: Query[ScheduleFilters]):
    require_scope(request, ApiKey.Scope.READ)
    found = Schedule.objects.filter(tenant=request.auth.tenant)
    if filters.kind is not None:
        found = found.filter(kind=filters.kind)
    if filters.enabled is not None:
        found = found.filter(enabled=filters.enabled)
    return {"items": list(found.order_by("-created_at", "-id")[: filters.limit])}


@router.get("/schedules/{schedule_id}", response={200: ScheduleOut} | ERRORS, summary="A schedule")
def get_schedule(request: ApiRequest, schedule_id: UUID):
    require_scope(request, ApiKey.Scope.READ)
    return _schedule(request, schedule_id)


@router.patch(
    "/schedules/{schedule_id}", response={200: ScheduleOut} | ERRORS, summary="Change a schedule"
)
def change_schedule(request: ApiRequest, schedule_id: UUID, payload: SchedulePatch):
    require_scope(request, ApiKey.Scope.WRITE)
    given = payload.model_dump(exclude_unset=True)
    with transaction.atomic():
        schedule = _schedule(request, schedule_id, lock=True)
        if "cron" in given or "every_seconds" in given or "timezone" in given:
            # A new cadence replaces the old one: cron and every_seconds exclude each other.
            cron = (
                given.get("cron") if "cron" in given or "every_seconds" in given else schedule.cron
            )
            every = (
                given.get("every_seconds")
                if "cron" in given or "every_seconds" in given
                else schedule.every_seconds
            )
            cadence = check_cadence(
                cron=cron, every_seconds=every, timezone=given.get("timezone") or schedule.timezone
            )
            schedule.cron, schedule.every_seconds = cadence.cron, cadence.every_seconds
            schedule.timezone = cadence.timezone
        if given.get("input") is not None:
            schedule.input = _validated_input(schedule.kind, given["input"])
        for field in ("name", "overlap", "catch_up", "enabled"):
            if given.get(field) is not None:
                setattr(schedule, field, given[field])
        schedule.updated_at = django_timezone.now()
        arm(schedule)
        schedule.save()
    return schedule


@router.delete(
    "/schedules/{schedule_id}", response={204: None} | ERRORS, summary="Delete a schedule"
)
def delete_schedule(request: ApiRequest, schedule_id: UUID):
    require_scope(request, ApiKey.Scope.WRITE)
    _schedule(request, schedule_id).delete()  # its runs stay; their schedule_id becomes null
    return Status(204, None)
