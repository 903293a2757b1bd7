"""Admin actions on runs: thin wrappers over runs.control and runs.operations.

The services lock the run, check its state and write the Event naming the
operator; an action only parses the form, calls them and reports. Bulk
actions accept a whole filtered selection ("select all") and walk it by
primary key in batches, one short transaction per batch.
"""

from __future__ import annotations

from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.db import transaction
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from runs import control, operations, selectors
from runs.admin import confirmations
from runs.admin.common import DOMAIN_ERRORS, Tally, action_field, json_block, operator
from runs.exceptions import QueueFull
from runs.models import Run, RunStatus, Step

BATCH_SIZE = 500
# On the run list (for the selection) and on a run's own page.
BOTH = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]


def apply_in_batches(
    queryset, service: Callable[[Run], object], *, batch_size: int = BATCH_SIZE
) -> Tally:
    """Call ``service`` on every selected run, one transaction per ``batch_size`` runs.

    Keyset pages on the primary key keep memory and lock time bounded however
    large the selection, and stay correct while the action moves runs out of
    the filter. Each service call is a savepoint: a run whose state refuses
    the action is counted as skipped and the batch goes on.
    """
    tally = Tally()
    runs = queryset.select_related(None).only("pk").order_by("pk")
    last = None
    while True:
        batch = list((runs if last is None else runs.filter(pk__gt=last))[:batch_size])
        if not batch:
            return tally
        with transaction.atomic():
            for run in batch:
                try:
                    outcome = service(run)
                except DOMAIN_ERRORS as exc:
                    tally.skip(exc)
                else:
                    tally.done += 1
                    tally.later += bool(getattr(outcome, "later", False))
        last = batch[-1].pk


@admin.action(
    description="Cancel this run…",
    description_plural="Cancel selected runs…",
    permissions=["cancel"],
    location=BOTH,
)
def cancel_runs(modeladmin, request, queryset):
    if confirmations.wants_confirmation(request):
        return confirmations.confirmation_page(
            modeladmin,
            request,
            queryset,
            action="cancel_runs",
            title="Cancel these runs?",
            button="Yes, cancel",
            intro="Queued and waiting runs stop at once; running runs at their next step boundary; "
            "finished runs are skipped.",
        )
    actor = operator(request)
    apply_in_batches(queryset, lambda run: control.cancel_run(run=run, actor=actor)).report(
        modeladmin, request, "Cancelled", later="running: they stop at their next step boundary"
    )
    return None


@admin.action(
    description="Retry (fresh attempt budget)",
    description_plural="Retry selected runs (fresh attempt budget)",
    permissions=["retry"],
    location=BOTH,
)
def retry_runs(modeladmin, request, queryset):
    actor = operator(request)
    apply_in_batches(queryset, lambda run: control.retry_run(run=run, actor=actor)).report(
        modeladmin, request, "Queued again"
    )


@admin.action(
    description="Requeue (its lease expired)",
    description_plural="Requeue selected stuck runs (lease expired)",
    permissions=["requeue"],
    location=BOTH,
)
def requeue_stuck_runs(modeladmin, request, queryset):
    actor = operator(request)
    apply_in_batches(
        queryset, lambda run: operations.requeue_stuck_run(run=run, actor=actor)
    ).report(modeladmin, request, "Requeued")


@admin.action(
    description="Approve…",
    description_plural="Approve the selected runs' pending approvals…",
    permissions=["approve"],
    location=BOTH,
)
def approve_runs(modeladmin, request, queryset):
    return decide(modeladmin, request, queryset, approved=True)


@admin.action(
    description="Reject…",
    description_plural="Reject the selected runs' pending approvals…",
    permissions=["approve"],
    location=BOTH,
)
def reject_runs(modeladmin, request, queryset):
    return decide(modeladmin, request, queryset, approved=False)


def decide(modeladmin, request, queryset, *, approved: bool):
    """Show the pending proposals, then decide exactly the steps shown (a run that moved on is skipped)."""
    action, verb = ("approve_runs", "approve") if approved else ("reject_runs", "reject")
    if confirmations.wants_confirmation(request):
        return confirmations.confirmation_page(
            modeladmin,
            request,
            queryset,
            action=action,
            title=f"{verb.capitalize()} these proposals?",
            button=f"Yes, {verb}",
            decision=True,
            across=False,
            intro="Each run goes on with your decision on the proposal shown; runs without a pending approval "
            "are skipped.",
        )
    actor = operator(request)
    service = control.approve_run if approved else control.reject_run
    apply_in_batches(
        queryset,
        lambda run: service(run=run, actor=actor, step=confirmations.seen_step(request, run)),
    ).report(modeladmin, request, "Approved" if approved else "Rejected")
    return None


class RetryFromStepForm(forms.Form):
    from_step = forms.IntegerField(
        min_value=1, help_text="Steps from this one on are discarded and run again."
    )
    deadline_seconds = forms.IntegerField(
        min_value=1,
        required=False,
        help_text="A new deadline, needed when the run failed on its deadline.",
    )
    cost_ceiling_cents = forms.DecimalField(
        min_value=0,
        max_digits=18,
        decimal_places=6,
        required=False,
        help_text="A new cost ceiling, needed when the run failed on its budget.",
    )


class ForkFromStepForm(forms.Form):
    from_step = forms.IntegerField(
        min_value=1,
        help_text="A new run replays the steps before this one and runs from this one on.",
    )


class ResolveForm(forms.Form):
    # Not "action": the admin's action bar already posts that name.
    resolution = forms.ChoiceField(
        widget=forms.RadioSelect,
        choices=[
            ("done", "The side effect happened: mark the step done with the output below"),
            ("retry", "It did not happen: run the step again"),
            ("fail", "Fail the run"),
        ],
    )
    output = forms.JSONField(required=False, help_text="JSON the step returns (for “done”).")


@admin.action(description="Retry from step N…", permissions=["retry"], location=BOTH)
def retry_from_step(modeladmin, request, queryset):
    run = single_run(modeladmin, request, queryset)
    if run is None:
        return None
    form = RetryFromStepForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        try:
            control.retry_run(run=run, actor=operator(request), **form.cleaned_data)
        except DOMAIN_ERRORS as exc:
            form.add_error(None, str(exc))
        else:
            modeladmin.message_user(
                request, f"Run {run.pk} queued again from step {form.cleaned_data['from_step']}."
            )
            return None
    steps = Step.objects.filter(run=run, generation=run.generation).order_by("seq")
    return action_form(
        modeladmin, request, run, form, "retry_from_step", "Retry from a step", steps=steps
    )


@admin.action(description="Fork from step N…", permissions=["retry"], location=BOTH)
def fork_from_step(modeladmin, request, queryset):
    run = single_run(modeladmin, request, queryset)
    if run is None:
        return None
    form = ForkFromStepForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        from_step = form.cleaned_data["from_step"]
        try:
            fork = control.fork_run(run=run, actor=operator(request), from_step=from_step)
        except (*DOMAIN_ERRORS, QueueFull) as exc:
            modeladmin.message_user(
                request,
                f"Run {run.pk} cannot be forked from step {from_step}: {exc}",
                messages.ERROR,
            )
        else:
            url = reverse("admin:runs_run_change", args=[fork.pk])
            modeladmin.message_user(
                request,
                format_html(
                    'Run {} forked from step {}: the new run is <a href="{}">{}</a>.',
                    run.pk,
                    from_step,
                    url,
                    fork.pk,
                ),
                messages.SUCCESS,
            )
            return None
    steps = Step.objects.filter(run=run, generation=run.generation).order_by("seq")
    return action_form(
        modeladmin, request, run, form, "fork_from_step", "Fork from a step", steps=steps
    )


@admin.action(description="Resolve the ambiguous step…", permissions=["resolve"], location=BOTH)
def resolve_runs(modeladmin, request, queryset):
    run = single_run(modeladmin, request, queryset)
    if run is None:
        return None
    form = ResolveForm(request.POST if "apply" in request.POST else None)
    if form.is_valid():
        try:
            control.resolve_run(
                run=run,
                actor=operator(request),
                action=form.cleaned_data["resolution"],
                output=form.cleaned_data["output"],
            )
        except DOMAIN_ERRORS as exc:
            form.add_error(None, str(exc))
        else:
            modeladmin.message_user(
                request, f"Run {run.pk} resolved: {form.cleaned_data['resolution']}."
            )
            return None
    waiting = selectors.waiting_for(run) if run.status == RunStatus.WAITING_HUMAN else None
    return action_form(
        modeladmin,
        request,
        run,
        form,
        "resolve_runs",
        "Resolve an ambiguous step",
        waiting=json_block(waiting) if waiting else None,
    )


def single_run(modeladmin, request, queryset) -> Run | None:
    runs = list(queryset[:2])
    if len(runs) != 1:
        modeladmin.message_user(
            request, "Select exactly one run for this action.", messages.WARNING
        )
        return None
    return runs[0]


def action_form(
    modeladmin, request, run: Run, form: forms.Form, action: str, title: str, **extra
) -> TemplateResponse:
    """The intermediate page of an action; it posts back to the changelist with ``apply``."""
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "opts": modeladmin.model._meta,
        "run": run,
        "form": form,
        "action": action,
        "action_field": action_field(request),  # the form posts back where it came from
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        **extra,
    }
    return TemplateResponse(request, "admin/runs/run/action_form.html", context)
