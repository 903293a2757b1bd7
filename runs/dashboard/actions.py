"""The run page's POST actions: thin calls into ``runs.control`` (and ``runs.webhooks`` for a redelivery).

Each action finds the run in the user's tenant (404), checks the role (403),
then calls the service. The answer is a redirect to the run page (or to the
page of this site the form names in ``next``: a thread's page decides its
turns' approvals) with a one-line message, so every button works without
JavaScript; an invalid form re-renders the run page with the error next to
the field (422). A state that no longer allows the action
(``InvalidTransition``) is reported, never forced.
"""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from django import forms as django_forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from runs import control, selectors
from runs.control import Outcome
from runs.dashboard import selectors as dashboard_selectors
from runs.dashboard.access import Access, Action, current_access, require
from runs.dashboard.forms import DecisionForm, MessageForm, ResolveForm, RetryForm
from runs.dashboard.presenters import CONFIRM_CANCEL, CONFIRM_REJECT, CONFIRM_ROLL_BACK
from runs.dashboard.views import actor_of, render_run_page
from runs.exceptions import InvalidRunInput, InvalidTransition
from runs.models import Run
from runs.webhooks import deliveries


def _target(request: HttpRequest, run_id: UUID, action: Action) -> tuple[Access, Run]:
    """404 for a run outside the user's tenant, then 403 for a role that does not allow the action."""
    access = current_access(request)
    run = selectors.get_run(tenant=access.tenant, run_id=run_id)
    require(access, action)
    return access, run


def _apply(
    request: HttpRequest, run: Run, call: Callable[[], Outcome], *, done: str, later: str = ""
) -> HttpResponse:
    try:
        outcome = call()
    except InvalidTransition as exc:
        messages.error(request, f"Nothing changed: {exc}. The page shows the run as it is now.")
    else:
        messages.success(request, later if outcome.later and later else done)
    return _back(request, run)


def _back(request: HttpRequest, run: Run) -> HttpResponse:
    """The run page, or the page of this site the form names in ``next`` (never another site)."""
    wanted = request.POST.get("next", "")
    if wanted.startswith("/") and url_has_allowed_host_and_scheme(
        wanted, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return redirect(wanted)
    return redirect("runs:detail", run_id=run.id)


def _invalid(
    request: HttpRequest, access: Access, run: Run, name: str, form: django_forms.Form
) -> HttpResponse:
    return render_run_page(request, access, run, forms={name: form}, status=422)


def _unconfirmed(
    request: HttpRequest, access: Access, run: Run, *, title: str, message: str, button: str
) -> HttpResponse | None:
    """A page asking to confirm a destructive action, unless the POST says it was confirmed.

    The run page's dialog confirms before posting (static/js/confirm.js);
    without JavaScript the same button lands here and nothing happens yet.
    """
    if request.POST.get("confirmed") == "1":
        return None
    fields = [
        (name, value)
        for name, value in request.POST.items()
        if name not in ("csrfmiddlewaretoken", "confirmed")
    ]
    return render(
        request,
        "runs/confirm.html",
        {
            "access": access,
            "tenant": access.tenant,
            "run": run,
            "title": title,
            "message": message,
            "button": button,
            "fields": fields,
            "action": request.path,
        },
    )


@require_POST
@login_required
def cancel(request: HttpRequest, run_id: UUID) -> HttpResponse:
    access, run = _target(request, run_id, Action.CANCEL)
    compensate = request.POST.get("compensate") == "1"
    if asked := _unconfirmed(
        request,
        access,
        run,
        button="Cancel and roll back" if compensate else "Cancel run",
        title="Cancel and roll back this run?" if compensate else "Cancel this run?",
        message=(CONFIRM_ROLL_BACK if compensate else CONFIRM_CANCEL),
    ):
        return asked
    return _apply(
        request,
        run,
        lambda: control.cancel_run(run=run, actor=actor_of(request), compensate=compensate),
        done="Run cancelled.",
        later=(
            "Rollback requested: the finished steps are undone, newest first, then the run is cancelled."
            if compensate
            else "Cancel requested: the run stops at the end of its current step."
        ),
    )


@require_POST
@login_required
def pause(request: HttpRequest, run_id: UUID) -> HttpResponse:
    _, run = _target(request, run_id, Action.PAUSE)
    return _apply(
        request,
        run,
        lambda: control.pause_run(run=run, actor=actor_of(request)),
        done="Run paused.",
        later="Pause requested: the run pauses at the end of its current step.",
    )


@require_POST
@login_required
def resume(request: HttpRequest, run_id: UUID) -> HttpResponse:
    _, run = _target(request, run_id, Action.RESUME)
    return _apply(
        request,
        run,
        lambda: control.resume_run(run=run, actor=actor_of(request)),
        done="Run resumed.",
    )


def _decide(request: HttpRequest, run_id: UUID, *, approved: bool) -> HttpResponse:
    access, run = _target(request, run_id, Action.APPROVE if approved else Action.REJECT)
    form = DecisionForm(request.POST)
    if not form.is_valid():
        return _invalid(request, access, run, "decision", form)
    if not approved and (
        asked := _unconfirmed(
            request,
            access,
            run,
            title="Reject this proposal?",
            message=CONFIRM_REJECT,
            button="Reject",
        )
    ):
        return asked
    service = control.approve_run if approved else control.reject_run
    try:
        return _apply(
            request,
            run,
            lambda: service(
                run=run,
                actor=actor_of(request),
                comment=form.cleaned_data["comment"],
                step=form.cleaned_data["step"],
            ),
            done="Approved: the run continues."
            if approved
            else "Rejected: the run continues without it.",
        )
    except InvalidRunInput as exc:
        form.add_error("comment", str(exc))
        return _invalid(request, access, run, "decision", form)


@require_POST
@login_required
def approve(request: HttpRequest, run_id: UUID) -> HttpResponse:
    return _decide(request, run_id, approved=True)


@require_POST
@login_required
def reject(request: HttpRequest, run_id: UUID) -> HttpResponse:
    return _decide(request, run_id, approved=False)


@require_POST
@login_required
def resolve(request: HttpRequest, run_id: UUID) -> HttpResponse:
    access, run = _target(request, run_id, Action.RESOLVE)
    form = ResolveForm(request.POST)
    if not form.is_valid():
        return _invalid(request, access, run, "resolve", form)
    action, output = form.cleaned_data["action"], form.cleaned_data["output"]
    try:
        return _apply(
            request,
            run,
            lambda: control.resolve_run(
                run=run, actor=actor_of(request), action=action, output=output
            ),
            done={
                "done": "Marked done: the run continues.",
                "retry": "The step runs again.",
                "fail": "The run failed.",
                "skip": "Skipped: the rollback goes on.",
            }[action],
        )
    except InvalidRunInput as exc:
        form.add_error("output", str(exc))
        return _invalid(request, access, run, "resolve", form)


@require_POST
@login_required
def post_message(request: HttpRequest, run_id: UUID) -> HttpResponse:
    access, run = _target(request, run_id, Action.MESSAGE)
    form = MessageForm(request.POST)
    if not form.is_valid():
        return _invalid(request, access, run, "message", form)
    try:
        return _apply(
            request,
            run,
            lambda: control.post_message(
                run=run, actor=actor_of(request), text=form.cleaned_data["text"]
            ),
            done="Message sent.",
        )
    except InvalidRunInput as exc:
        form.add_error("text", str(exc))
        return _invalid(request, access, run, "message", form)


@require_POST
@login_required
def retry(request: HttpRequest, run_id: UUID) -> HttpResponse:
    access, run = _target(request, run_id, Action.RETRY)
    form = RetryForm(request.POST)
    if not form.is_valid():
        return _invalid(request, access, run, "retry", form)
    wanted = form.cleaned_data
    try:
        return _apply(
            request,
            run,
            lambda: control.retry_run(
                run=run,
                actor=actor_of(request),
                from_step=wanted["from_step"],
                deadline_seconds=wanted["deadline_seconds"],
                cost_ceiling_cents=wanted["cost_ceiling_cents"],
            ),
            done="Run queued again.",
        )
    except InvalidRunInput as exc:
        form.add_error("from_step", str(exc))
        return _invalid(request, access, run, "retry", form)


@require_POST
@login_required
def redeliver(request: HttpRequest, run_id: UUID, delivery_id: int) -> HttpResponse:
    """Send a delivered or dead webhook delivery's Event again; whoever may retry a run may do this."""
    _, run = _target(request, run_id, Action.RETRY)
    delivery = dashboard_selectors.get_delivery(run=run, delivery_id=delivery_id)
    if delivery is None:
        raise Http404("webhook delivery not found")

    def send_again() -> Outcome:
        deliveries.redeliver(delivery=delivery, actor=actor_of(request))
        return Outcome(run=run)  # the run itself does not change

    return _apply(
        request, run, send_again, done=f"The {delivery.event_type} webhook will be sent again."
    )
