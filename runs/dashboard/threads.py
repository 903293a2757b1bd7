"""The dashboard's conversation pages: the thread list, the New thread form, a thread's page and its actions.

A thread's page reads as a conversation, grouped by turn (``runs.dashboard.conversations``
reads it); its composer says what a message will do under the thread's
policy before it is sent. The same access rules as runs: any member reads,
whoever may submit runs starts a thread, whoever may message a run posts,
whoever may cancel a run closes a thread (closing cancels its live turn);
an approval inside a turn is decided through the run's own actions.

Without JavaScript every form posts and lands back on the page. With it,
the composer posts through htmx and gets itself back with the conversation
(refusals included: static/js/thread-stream.js swaps 409 and 422 answers),
and the page follows the thread's event stream, asking for the
conversation again after each Event; where no stream is served it polls
while a turn is live.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode
from uuid import UUID, uuid4

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from runs import kinds, threads
from runs.dashboard import conversations
from runs.dashboard.access import Access, Action, current_access, require
from runs.dashboard.forms import CloseThreadForm, ThreadFilterForm, ThreadForm, ThreadMessageForm
from runs.dashboard.presenters import CONFIRM_REJECT, money
from runs.dashboard.views import (
    HtmxHttpRequest,
    actor_of,
    form_key,
    login_required_polls,
)
from runs.exceptions import IdempotencyConflict, InvalidRunInput, QueueFull, UnknownKind
from runs.models import Thread
from runs.states import ThreadStatus
from runs.streams.sse import streams_served
from runs.threads import selectors as thread_selectors

PAGE_SIZE = 50


def _thread_of(
    request: HttpRequest, thread_id: UUID, action: Action | None = None
) -> tuple[Access, Thread]:
    """404 for a thread outside the user's tenant, then 403 for a role that does not allow ``action``."""
    access = current_access(request)
    thread = thread_selectors.get_thread(tenant=access.tenant, thread_id=thread_id)
    if action is not None:
        require(access, action)
    return access, thread


# The thread list


@login_required_polls
def thread_list(request: HtmxHttpRequest) -> HttpResponse:
    access = current_access(request)
    filters = ThreadFilterForm(request.GET)
    page, error = thread_selectors.ThreadPage(items=[], next_cursor=None), ""
    if filters.is_valid():
        wanted = filters.cleaned_data
        try:
            page = thread_selectors.list_threads(
                tenant=access.tenant,
                limit=PAGE_SIZE,
                cursor=wanted["cursor"] or None,
                status=wanted["status"] or None,
            )
        except InvalidRunInput as exc:  # a mangled cursor
            error = str(exc)
    live = any(thread.status == ThreadStatus.ACTIVE for thread in page.items)
    activity = conversations.last_activity(page.items)
    context = {
        "access": access,
        "tenant": access.tenant,
        "filters": filters,
        "filtered": any(request.GET.get(name) for name in ("status", "cursor")),
        "rows": [(thread, activity[thread.pk]) for thread in page.items],
        "error": error,
        "live": live,
        "next_url": _page_url(filters, page.next_cursor),
        "poll_url": request.get_full_path(),
    }
    if request.htmx:
        response = render(request, "runs/threads.html#threads", context)
        if not live:
            response.status_code = 286  # htmx stops polling: no turn is live
        return response
    return render(request, "runs/threads.html", context)


def _page_url(filters: ThreadFilterForm, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    status = filters.data.get("status", "")
    return "?" + urlencode({**({"status": status} if status else {}), "cursor": cursor})


# Starting a thread


@login_required
def thread_new(request: HttpRequest) -> HttpResponse:
    """Pick the agent, name the thread, choose its policy, say the first thing; land on its page."""
    access = current_access(request)
    require(access, Action.SUBMIT)
    playable = conversations.conversation_kinds(kinds.startable_kinds(access.tenant))
    asked = request.GET.get("kind", "")
    form = ThreadForm(
        request.POST if request.method == "POST" else None,
        # No agent is picked for the person unless there is only one.
        kinds=([] if len(playable) == 1 else [("", "Choose an agent")])
        + [(kind.name, kind.name) for kind in playable],
        policies=conversations.POLICY_CHOICES,
        initial={"kind": asked if asked else (playable[0].name if len(playable) == 1 else None)},
    )
    key = form_key(request)
    if request.method == "POST" and form.is_valid():
        wanted = form.cleaned_data
        try:
            thread, posted, created = threads.create_thread(
                tenant=access.tenant,
                kind=wanted["kind"],
                actor=actor_of(request),
                title=wanted["title"],
                policy=wanted["policy"],
                cost_ceiling_cents=wanted["cost_ceiling_cents"],
                idempotency_key=key,
                message=wanted["message"] or None,
            )
        except IdempotencyConflict:
            form.add_error(
                None,
                "This form was already used to start another thread; send it again for a new one.",
            )
            key = uuid4().hex
        except (InvalidRunInput, QueueFull, UnknownKind, threads.ThreadBudgetSpent) as exc:
            form.add_error(None, f"The thread was not started: {exc}.")
        else:
            if not created:
                messages.info(request, "This form was already sent: here is its thread.")
            elif posted is not None:
                messages.success(request, "Thread started: the agent is reading your message.")
            else:
                messages.success(
                    request, "Thread started. It sleeps until a message mentions the agent."
                )
            return redirect("runs:thread", thread_id=thread.pk)
    context = {
        "access": access,
        "tenant": access.tenant,
        "form": form,
        "kinds": playable,
        "idempotency_key": key,
    }
    return render(request, "runs/threads_new.html", context, status=422 if form.errors else 200)


# A thread's page


@login_required
def thread_detail(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    access, thread = _thread_of(request, thread_id)
    return render_thread_page(request, access, thread)


@login_required_polls
def thread_conversation(request: HtmxHttpRequest, thread_id: UUID) -> HttpResponse:
    """The conversation again, with the thread's facts, state and composer sentence (out of band)."""
    access, thread = _thread_of(request, thread_id)
    return _refresh(request, access, thread)


def _refresh(request: HttpRequest, access: Access, thread: Thread) -> HttpResponse:
    context = thread_context(access, thread)
    context.update(oob=True, hint_oob=True)
    return render(request, "runs/threads_detail.html#refresh", context)


def render_thread_page(
    request: HttpRequest,
    access: Access,
    thread: Thread,
    *,
    message_form: ThreadMessageForm | None = None,
    refusal: str = "",
    close_form: CloseThreadForm | None = None,
    status: int = 200,
) -> HttpResponse:
    context = thread_context(
        access, thread, message_form=message_form, refusal=refusal, close_form=close_form
    )
    if thread.status != ThreadStatus.CLOSED and streams_served(request):
        # Only a page an ASGI server answered follows an event stream (runs.streams.sse).
        context["stream_url"] = _stream_url(thread, context["conversation"].position)
    return render(request, "runs/threads_detail.html", context, status=status)


def _stream_url(thread: Thread, position: str) -> str:
    """The thread's event stream after the Events the page already shows (the session authenticates it)."""
    url = reverse("api:events", kwargs={"thread_id": thread.pk})
    return url + ("?" + urlencode({"last_event_id": position}) if position else "")


def thread_context(
    access: Access,
    thread: Thread,
    *,
    message_form: ThreadMessageForm | None = None,
    refusal: str = "",
    close_form: CloseThreadForm | None = None,
    sent: str = "",
) -> dict[str, Any]:
    conversation = conversations.read_conversation(thread)
    refresh_url = reverse("runs:thread_conversation", args=[thread.pk])
    return {
        "access": access,
        "tenant": access.tenant,
        "thread": thread,
        "title": conversations.thread_title(thread),
        "status_label": conversations.thread_status_label(thread.status),
        "policy_label": dict(conversations.POLICY_CHOICES).get(thread.policy, thread.policy),
        "conversation": conversation,
        "hint": conversations.composer_hint(thread),
        "state_rows": conversations.state_rows(thread.state),
        "cost": _cost_words(thread),
        "cost_percent": conversations.cost_percent(thread),
        "may_post": access.can(Action.MESSAGE),
        "may_close": access.can(Action.CANCEL),
        "may_decide": access.can(Action.APPROVE),
        "message_form": message_form or ThreadMessageForm(),
        "refusal": refusal,
        "sent": sent,
        "close_form": close_form or CloseThreadForm(),
        "confirm_close": conversations.CONFIRM_CLOSE,
        "confirm_reject": CONFIRM_REJECT,
        "here": reverse("runs:thread", args=[thread.pk]),
        "refresh_url": refresh_url,
        # Polled only where no event stream is followed (static/js/thread-stream.js holds polls back).
        "poll_url": refresh_url if thread.status == ThreadStatus.ACTIVE else "",
    }


def _cost_words(thread: Thread) -> str:
    if thread.cost_ceiling_cents is None:
        return money(thread.cost_cents)
    return f"{money(thread.cost_cents)} of {money(thread.cost_ceiling_cents)}"


# Posting, closing


@require_POST
@login_required_polls  # an htmx post from a session that ended reloads the page, not the login form
def thread_message(request: HtmxHttpRequest, thread_id: UUID) -> HttpResponse:
    """Post to the thread; refusals (409, 429) and form errors (422) come back in the composer, never a 500."""
    access, thread = _thread_of(request, thread_id, Action.MESSAGE)
    form = ThreadMessageForm(request.POST)
    if not form.is_valid():
        return _composer(request, access, thread, form=form, status=422)
    try:
        posted = threads.post_thread_message(
            thread=thread,
            text=form.cleaned_data["text"],
            actor=actor_of(request),
            mention=form.cleaned_data["mention"],
        )
    except InvalidRunInput as exc:
        form.add_error("text", str(exc))
        return _composer(request, access, thread, form=form, status=422)
    except threads.TurnLive as exc:
        return _composer(
            request,
            access,
            thread,
            form=form,
            status=409,
            refusal=f"Not sent: turn {exc.turn} is live, and this thread's policy (reject) refuses "
            "messages until it ends. Send it again once the agent has answered.",
        )
    except threads.ThreadClosed:
        return _composer(
            request,
            access,
            thread,
            form=form,
            status=409,
            refusal="Not sent: this thread is closed, so it takes no more messages.",
        )
    except threads.ThreadBudgetSpent:
        thread.refresh_from_db()
        later = (
            " Untick “Mention the agent” to leave it for a later turn."
            if thread.status == ThreadStatus.ASLEEP
            else ""
        )
        return _composer(
            request,
            access,
            thread,
            form=form,
            status=409,
            refusal=f"Not sent: the thread's cost ceiling is spent ({_cost_words(thread)}), so no new "
            f"turn can start.{later}",
        )
    except QueueFull as exc:
        response = _composer(
            request,
            access,
            thread,
            form=form,
            status=429,
            refusal=f"Not sent: {exc}. Try again in a few seconds.",
        )
        response["Retry-After"] = str(exc.retry_after)
        return response
    sent = conversations.delivered_sentence(posted.delivered, posted.run)
    if not request.htmx:
        messages.success(request, sent)
        return redirect("runs:thread", thread_id=thread.pk)
    thread.refresh_from_db()
    context = thread_context(access, thread, sent=sent)
    context.update(oob=True, conversation_oob=True)
    return render(request, "runs/threads_detail.html#posted", context)


def _composer(
    request: HtmxHttpRequest,
    access: Access,
    thread: Thread,
    *,
    form: ThreadMessageForm,
    status: int,
    refusal: str = "",
) -> HttpResponse:
    """The composer with its error: alone for htmx (which swaps it in place), else the whole page."""
    thread.refresh_from_db()
    if not request.htmx:
        return render_thread_page(
            request, access, thread, message_form=form, refusal=refusal, status=status
        )
    context = thread_context(access, thread, message_form=form, refusal=refusal)
    return render(request, "runs/threads_detail.html#composer", context, status=status)


@require_POST
@login_required
def thread_close(request: HttpRequest, thread_id: UUID) -> HttpResponse:
    access, thread = _thread_of(request, thread_id, Action.CANCEL)
    form = CloseThreadForm(request.POST)
    if not form.is_valid():
        return render_thread_page(request, access, thread, close_form=form, status=422)
    if request.POST.get("confirmed") != "1":
        # The page's dialog confirms before posting (static/js/confirm.js); without JavaScript, here.
        return render(
            request,
            "runs/threads_confirm.html",
            {
                "access": access,
                "tenant": access.tenant,
                "thread": thread,
                "title": conversations.thread_title(thread),
                "message": conversations.CONFIRM_CLOSE,
                "summary": form.cleaned_data["summary"],
            },
        )
    try:
        threads.close_thread(
            thread=thread, actor=actor_of(request), summary=form.cleaned_data["summary"]
        )
    except threads.ThreadClosed:
        messages.error(request, "Nothing changed: the thread was closed already.")
    except InvalidRunInput as exc:
        form.add_error("summary", str(exc))
        return render_thread_page(request, access, thread, close_form=form, status=422)
    else:
        messages.success(request, "Thread closed: it takes no more messages.")
    return redirect("runs:thread", thread_id=thread.pk)
