"""Formatting filters of the dashboard templates (presentation only; see runs.dashboard.presenters)."""

from __future__ import annotations

from django import template
from django.utils import timezone

from runs.dashboard import presenters, run_facts
from runs.errors import tenant_error
from runs.models import Step

register = template.Library()

register.filter("status_label", presenters.status_label)
register.filter("money", presenters.money)
register.filter("duration", presenters.duration)
register.filter("pretty_json", presenters.pretty_json)
register.filter("ago", presenters.ago)
register.filter("headline", presenters.headline)
register.filter("steps_count", run_facts.steps_count)


# Tenants read an error's exception lines; the traceback is the operators', in the admin.
register.filter("tenant_error", tenant_error)


@register.filter
def step_badge(step: Step, run) -> run_facts.StepBadge:
    return run_facts.step_badge(step, run)


@register.filter
def step_seconds(step: Step) -> float | None:
    """How long a step took, or has been running so far."""
    if step.started_at is None:
        return None
    end = step.ended_at or timezone.now()
    return max(0.0, (end - step.started_at).total_seconds())
