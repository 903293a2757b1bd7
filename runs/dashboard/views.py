"""The dashboard's pages: the run list, the run page, the submit form (POST actions: runs.dashboard.actions).

One view per screen. For htmx polls a view answers with a named partial of
its template; at a terminal state it answers 286, which stops htmx polling.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode
from uuid import UUID, uuid4

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views import defaults
from django.views.decorators.csrf import requires_csrf_token
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRefresh
from django_htmx.middleware import HtmxDetails

from runs import kinds, selectors, services
from runs.actors import describe_actors, message_author, parse_actor
from runs.dashboard import presenters, run_facts
from runs.dashboard import selectors as dashboard_selectors
from runs.dashboard.access import (
    Access,
    Action,
    NoMembership,
    current_access,
    require,
    select_tenant,
)
from runs.dashboard.activity import activity, who_cancelled
from runs.dashboard.forms import (
    DecisionForm,
    KindInputForm,
    MessageForm,
    ResolveForm,
    RetryForm,
    RunFilterForm,
)
from runs.exceptions import IdempotencyConflict, InvalidRunInput, QueueFull, UnknownKind
from runs.models import Run, RunStatus, Thread
from runs.registry import all_kinds
from runs.streams.sse import streams_served
from runs.text import find_unstorable

# htmx stops polling when a response has this status (a terminal run, a list with no live run).
HTMX_STOP_POLLING = 286
PAGE_SIZE = 50


class HtmxHttpRequest(HttpRequest):
    """A request through django-htmx's middleware, which tells whether htmx sent it."""

    htmx: HtmxDetails


def login_required_polls(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """``login_required``, except that an htmx poll from a session that ended reloads the page.

    Otherwise htmx would follow the redirect and swap the login page into the run table.
    """
    protected = login_required(view)

    @wraps(view)
    def wrapper(request: HtmxHttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.htmx and not request.user.is_authenticated:
            return HttpResponseClientRefresh()
        return protected(request, *args, **kwargs)

    return wrapper


def actor_of(request: HttpRequest) -> services.Actor:
    return services.Actor(type="user", id=str(request.user.pk))


# The run list


@login_required_polls
def run_list(request: HtmxHttpRequest) -> HttpResponse:
    access = current_access(request)
    filters = RunFilterForm(request.GET, kinds=[kind.name for kind in all_kinds()])
    page, error = selectors.Page(items=[], next_cursor=None), ""
    if filters.is_valid():
        wanted = filters.cleaned_data
        try:
            page = selectors.list_runs(
                tenant=access.tenant,
                limit=PAGE_SIZE,
                cursor=wanted["cursor"] or None,
                status=wanted["status"] or None,
                kind=wanted["kind"] or None,
                id_search=filters.id_search,
                search=(wanted["q"] or None) if filters.id_search is None else None,
                schedule=wanted["schedule"],
                without_payloads=True,
            )
        except InvalidRunInput as exc:  # a mangled cursor
            error = str(exc)
    live = any(not run.is_terminal for run in page.items)
    context = {
        "access": access,
        "tenant": access.tenant,
        "filters": filters,
        "filtered": filters.is_bound
        and any(request.GET.get(name) for name in ("status", "kind", "q", "cursor")),
        "page": page,
        "error": error,
        "live": live,
        "waiting_count": (
            dashboard_selectors.count_waiting_for_people(tenant=access.tenant)
            if access.can_approve
            else None
        ),
        "next_url": _page_url(filters, page.next_cursor),
        "poll_url": request.get_full_path(),
    }
    if request.htmx:
        response = render(request, "runs/list.html#runs", context)
        if not live:
            response.status_code = HTMX_STOP_POLLING
        return response
    return render(request, "runs/list.html", context)


def _page_url(filters: RunFilterForm, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    kept = {name: filters.data.get(name, "") for name in ("status", "kind", "q", "schedule")}
    return "?" + urlencode({**{k: v for k, v in kept.items() if v}, "cursor": cursor})


# The run page


@login_required_polls
def run_detail(request: HtmxHttpRequest, run_id: UUID) -> HttpResponse:
    access = current_access(request)
    run = selectors.get_run(tenant=access.tenant, run_id=run_id)
    if request.htmx:
        return _poll(request, access, run)
    return render_run_page(request, access, run)


def render_run_page(
    request: HttpRequest,
    access: Access,
    run: Run,
    *,
    forms: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    """The whole run page; ``forms`` replaces blank forms with bound ones that carry errors (422)."""
    context = run_context(access, run, controls=True, work=True, deliveries=True, forms=forms)
    context.update(
        input_rows=run_facts.input_rows(run.input), input_json=presenters.pretty_json(run.input)
    )
    first = context["activity"].entries[:1]
    if first and first[0].seq == 1 and first[0].who:
        context["submitted_by"] = first[0].who
    if request.user.is_staff:
        context["admin_url"] = reverse("admin:runs_run_change", args=[run.id])
    if run.thread_id is not None:
        # A turn of a conversation: the page names its thread (one query, for turns only).
        context["thread"] = (
            Thread.objects.filter(pk=run.thread_id, tenant=access.tenant)
            .only("id", "title", "kind")
            .first()
        )
    if not run.is_terminal and streams_served(request):
        # Only a page an ASGI server answered follows an event stream (runs.streams.sse).
        context["stream_url"] = _stream_url(run)
        context["status_labels"] = presenters.STATUS_LABELS
    return render(request, "runs/detail.html", context, status=status)


def _stream_url(run: Run) -> str:
    """The run's event stream after the Events the page already shows (the session authenticates it)."""
    return (
        reverse("api:events", kwargs={"run_id": run.id})
        + "?"
        + urlencode({"last_event_id": run.last_event_seq})
    )


def _poll(request: HttpRequest, access: Access, run: Run) -> HttpResponse:
    """The progress section, plus the controls, the timeline and the webhook deliveries when they changed.

    The page's run stream asks for the same answer after an Event (``via=stream``
    in its URL, only to tell its requests from polls in logs).
    """
    controls_changed = request.GET.get("state") != presenters.controls_version(run)
    work_changed = request.GET.get("seen") != presenters.timeline_version(run)
    context = run_context(
        access,
        run,
        controls=controls_changed,
        work=work_changed,
        deliveries=work_changed and presenters.deliveries_may_have_changed(run),
    )
    context["oob"] = True
    response = render(request, "runs/detail.html#poll", context)
    if run.is_terminal:
        response.status_code = HTMX_STOP_POLLING
    return response


def run_context(
    access: Access,
    run: Run,
    *,
    controls: bool,
    work: bool,
    deliveries: bool = False,
    forms: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What the run page's parts show; ``controls``, ``work`` and ``deliveries`` say which parts to load."""
    state, seen = presenters.controls_version(run), presenters.timeline_version(run)
    context: dict[str, Any] = {
        "access": access,
        "tenant": access.tenant,
        "run": run,
        "status_label": presenters.status_label(run.status),
        "headline": presenters.headline(run),
        "elapsed": presenters.duration(presenters.elapsed_seconds(run)),
        "progress": presenters.progress_percent(run),
        "steps_count": run_facts.steps_count(run),
        "failed_tries": run_facts.failed_tries(run),
        # Only a live run with a named step needs its last row to say what the name means.
        "now": run_facts.now_step(
            run,
            dashboard_selectors.last_step(run=run)
            if not run.is_terminal and run.current_step
            else None,
        ),
        "cost_percent": presenters.cost_percent(run),
        "advice": presenters.advice(
            run, cancelled_by=who_cancelled(run) if run.status == RunStatus.CANCELLED else ""
        ),
        "poll_url": reverse("runs:detail", args=[run.id])
        + "?"
        + urlencode({"state": state, "seen": seen}),
        "controls_changed": controls,
        "work_changed": work,
        "deliveries_changed": deliveries,
    }
    if controls:
        waiting = selectors.waiting_for(run)
        pending = (waiting or {}).get("step")
        context.update(
            waiting=waiting,
            waiting_json=_waiting_json(waiting),
            controls=presenters.controls(run, access, waiting),
            confirm_texts={
                "cancel": presenters.CONFIRM_CANCEL,
                "roll_back": presenters.CONFIRM_ROLL_BACK,
                "reject": presenters.CONFIRM_REJECT,
            },
            new_bound=presenters.needs_new_bound(run),
            run_messages=_named_messages(run),
            decision_form=DecisionForm(initial={"step": pending}),
            message_form=MessageForm(),
            resolve_form=ResolveForm(),
            retry_form=RetryForm.for_run(run),
        )
        context.update({f"{name}_form": form for name, form in (forms or {}).items()})
    # Children change without their parent's events: while it waits for them, its
    # tree (and timeline) is read on every poll.
    if run.status == RunStatus.WAITING and run.children_pending:
        context["work_changed"] = work = True
    if work:
        steps = dashboard_selectors.timeline(run=run)
        # Only a run with a spawn step has children to look up.
        context["family"] = dashboard_selectors.family(
            run=run, children=any(item.step.kind == "child" for item in steps)
        )
        context.update(
            author_names=_message_authors(run, steps),
            activity=activity(run),
            steps=steps,
            step_in_progress=run_facts.step_in_progress(run, [item.step for item in steps]),
            next_seq=(steps[-1].step.seq if steps else 0) + 1,
            result_json=None if run.result is None else presenters.pretty_json(run.result),
        )
    if deliveries:
        context["deliveries"] = presenters.delivery_rows(
            dashboard_selectors.recent_deliveries(run=run), access
        )
        context["may_redeliver"] = access.can(Action.RETRY)
    return context


def _message_authors(run: Run, steps: list) -> dict[str, str]:
    """Names of the people whose messages the run's message steps read, keyed "user:7" as the steps store them."""
    authors = {
        message["author"]
        for item in steps
        if item.step.kind == "message" and isinstance(item.step.output, list)
        for message in item.step.output
        if isinstance(message, dict) and isinstance(message.get("author"), str)
    }
    if not authors:
        return {}
    names = describe_actors((parse_actor(author) for author in authors), tenant_id=run.tenant_id)
    return {f"{type_}:{id_}": name for (type_, id_), name in names.items()}


def _named_messages(run: Run) -> list[tuple[Any, str]]:
    """The run's latest messages with their authors' names (one query per kind of author)."""
    found = dashboard_selectors.recent_messages(run=run)
    names = describe_actors(((m.author_type, m.author_id) for m in found), tenant_id=run.tenant_id)
    return [(message, message_author(message, names)) for message in found]


def _waiting_json(waiting: dict | None) -> str | None:
    """The proposal of a pending approval, or the input of an ambiguous step, as indented JSON text."""
    if not waiting:
        return None
    if waiting["type"] == "approval":
        return presenters.pretty_json(waiting.get("proposal"))
    if waiting["type"] == "ambiguous":
        return presenters.pretty_json(waiting.get("input"))
    return None


@login_required
def artifact_download(request: HttpRequest, run_id: UUID, artifact_id: int) -> FileResponse:
    access = current_access(request)
    run = selectors.get_run(tenant=access.tenant, run_id=run_id)
    artifact = dashboard_selectors.get_artifact(run=run, artifact_id=artifact_id)
    if artifact is None:
        raise Http404("artifact not found")
    try:
        handle = artifact.file.open("rb")
    except (FileNotFoundError, ValueError):
        raise Http404("the artifact's file is missing from storage") from None
    # Agent output is untrusted: always a download, never rendered by the browser.
    response = FileResponse(
        handle, as_attachment=True, filename=artifact.name, content_type="application/octet-stream"
    )
    response["Content-Security-Policy"] = "sandbox"
    return response


# Submitting


@login_required
def submit_form(request: HttpRequest) -> HttpResponse:
    """Pick a kind, fill in the form built from its input schema, and land on the new run's page."""
    access = current_access(request)
    require(access, Action.SUBMIT)
    kind_name = request.GET.get("kind", "")
    # A kind the tenant may not start is one the form does not know (runs.kinds).
    kind = kinds.startable_kind(access.tenant, kind_name) if kind_name else None
    context: dict[str, Any] = {
        "access": access,
        "tenant": access.tenant,
        "kind": kind,
        "kinds": kinds.startable_kinds(access.tenant),
    }
    if kind is None:
        context["unknown_kind"] = kind_name
        return render(request, "runs/submit.html", context, status=404 if kind_name else 200)
    form = KindInputForm(
        kind.input_json_schema(), request.POST if request.method == "POST" else None
    )
    key = form_key(request)
    if request.method == "POST" and form.is_valid():
        try:
            submitted = services.submit(
                tenant=access.tenant,
                kind=kind.name,
                input=form.input_data(),
                idempotency_key=key,
                actor=actor_of(request),
            )
        except InvalidRunInput as exc:
            form.add_input_errors(str(exc), exc.errors)
        except IdempotencyConflict:
            form.add_error(
                None,
                "This form was already used to submit another run; submit again for a new one.",
            )
            key = uuid4().hex
        except (QueueFull, UnknownKind) as exc:
            form.add_error(None, str(exc))
        else:
            created = (
                "Run submitted."
                if submitted.created
                else "This form was already submitted: here is its run."
            )
            messages.success(request, created)
            return redirect("runs:detail", run_id=submitted.run.id)
    context.update(form=form, idempotency_key=key)
    return render(request, "runs/submit.html", context, status=422 if form.errors else 200)


def form_key(request: HttpRequest) -> str:
    """One key per rendered form: a double click or a resent POST finds the run it created.

    A key the server did not write (too long, or with characters PostgreSQL
    cannot store) is replaced, like a missing one.
    """
    key = request.POST.get("idempotency_key", "")
    if not key or len(key) > 255 or find_unstorable(key) is not None:
        return uuid4().hex
    return key


# Tenants


@require_POST
@login_required
def switch_tenant(request: HttpRequest) -> HttpResponse:
    tenant = select_tenant(request, request.POST.get("tenant", ""))
    messages.info(request, f"Now showing the runs of {tenant.name}.")
    return redirect("runs:list")


@requires_csrf_token
def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    """The 403 handler: a user without a tenant gets a page that names them and leads out."""
    if isinstance(exception, NoMembership):
        return render(request, "no_membership.html", {"exception": str(exception)}, status=403)
    return defaults.permission_denied(request, exception)
