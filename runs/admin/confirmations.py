"""The page a destructive or deciding action shows before it acts: the runs it will touch, and what they propose.

Cancel, approve and reject on the run list first answer with this page (as
Django's own "delete selected" does); its button posts the same action
again with ``apply``. Approvals show each run's pending proposal, and the
decision is taken on exactly those runs and steps: a run that moved on to
another approval meanwhile is skipped, not decided unseen.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib.admin import helpers
from django.http import HttpRequest
from django.template.response import TemplateResponse

from runs.admin.common import action_field
from runs.dashboard.rendering import proposal_view
from runs.models import Run, RunStatus, Step, StepStatus

SHOWN = 50  # runs listed on the page; a larger "select all" is cancelled in batches, decided 50 at a time
STEP_FIELD = "step-{}"  # the pending approval's seq the operator saw, per run


def wants_confirmation(request: HttpRequest) -> bool:
    return "apply" not in request.POST


def seen_step(request: HttpRequest, run: Run) -> int | None:
    """The approval step the operator was shown for this run (None: whichever is pending)."""
    value = request.POST.get(STEP_FIELD.format(run.pk), "")
    return int(value) if value.isdigit() else None


def pending_approvals(runs: list[Run]) -> dict[UUID, Step]:
    """Each run's pending approval step, in one query (the step ``control.approve_run`` would decide)."""
    generations = {run.pk: run.generation for run in runs if run.status == RunStatus.WAITING_HUMAN}
    steps = Step.objects.filter(
        run_id__in=generations, kind="approval", status=StepStatus.WAITING
    ).order_by("run_id", "-seq")
    pending: dict[UUID, Step] = {}
    for step in steps:
        if step.generation == generations[step.run_id]:
            pending.setdefault(step.run_id, step)
    return pending


def confirmation_page(
    modeladmin,
    request: HttpRequest,
    queryset,
    *,
    action: str,
    title: str,
    button: str,
    intro: str,
    decision: bool = False,
    across: bool = True,
) -> TemplateResponse:
    """The confirmation page of ``action`` for the selected runs (the first ``SHOWN`` of them listed).

    ``decision``: show and pin each run's pending approval. ``across``: a
    "select all" of the filtered list stays a select all (cancel); otherwise
    the action applies to the listed runs only.
    """
    listed = list(queryset.select_related("tenant").order_by("-created_at", "-id")[: SHOWN + 1])
    more, listed = len(listed) > SHOWN, listed[:SHOWN]
    pending = pending_approvals(listed) if decision else {}
    rows = []
    for run in listed:
        step = pending.get(run.pk)
        # Read as the dashboard's approval card reads it: summary, target, before/after rows, else JSON.
        proposal = proposal_view((step.input or {}).get("proposal")) if step is not None else None
        rows.append(
            {
                "run": run,
                "step": step,
                "proposal": proposal,
                "step_field": STEP_FIELD.format(run.pk),
            }
        )
    select_across = across and request.POST.get("select_across") == "1"
    selected = (
        request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        if select_across
        else [str(r.pk) for r in listed]
    )
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "opts": modeladmin.model._meta,
        "rows": rows,
        "more": more,
        "shown": SHOWN,
        "decision": decision,
        "intro": intro,
        "button": button,
        "action": action,
        "action_field": action_field(request),
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "selected": selected,
        "select_across": select_across,
        "back": request.get_full_path(),
    }
    return TemplateResponse(request, "admin/runs/run/confirm_action.html", context)
