"""The tenant's schedules on the dashboard: what fires when, what it made and missed; pause and resume."""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from runs.dashboard.access import Action, current_access, require
from runs.models import Schedule
from runs.schedules import arm


@login_required
def schedule_list(request: HttpRequest) -> HttpResponse:
    access = current_access(request)
    rows = Schedule.objects.filter(tenant=access.tenant).order_by("-enabled", "next_fire_at", "id")
    return render(
        request,
        "runs/schedules.html",
        {"access": access, "tenant": access.tenant, "schedules": list(rows[:500])},
    )


@login_required
@require_POST
def schedule_toggle(request: HttpRequest, schedule_id: UUID) -> HttpResponse:
    """Pause a schedule (no more fires) or resume it (its next fire time from now)."""
    access = current_access(request)
    require(access, Action.PAUSE)
    with transaction.atomic():
        schedule = (
            Schedule.objects.select_for_update()
            .filter(tenant=access.tenant, pk=schedule_id)
            .first()
        )
        if schedule is None:
            raise Http404("no such schedule")
        schedule.enabled = not schedule.enabled
        schedule.updated_at = timezone.now()
        arm(schedule)
        schedule.save(update_fields=["enabled", "next_fire_at", "updated_at"])
    messages.success(
        request, f"{schedule}: {'resumed' if schedule.enabled else 'paused, it fires no more'}."
    )
    return redirect("runs:schedules")
