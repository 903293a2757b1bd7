"""The minimal dashboard: the tenant's runs and a run page whose progress polls every 2 s."""

from __future__ import annotations

import json
from typing import Any
from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from runs import selectors
from runs.models import Membership, Run, Tenant

# htmx stops polling when a response has this status (a terminal run).
HTMX_STOP_POLLING = 286


def current_tenant(request: HttpRequest) -> Tenant:
    membership = (
        Membership.objects.select_related("tenant")
        .filter(user=request.user)
        .order_by("tenant__slug")
        .first()
    )
    if membership is None:
        raise Http404("you are not a member of any tenant")
    return membership.tenant


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    tenant = current_tenant(request)
    page = selectors.list_runs(tenant=tenant, limit=50, cursor=request.GET.get("cursor") or None)
    return render(request, "runs/list.html", {"tenant": tenant, "page": page})


def pretty_json(value: Any) -> str:
    """Model and tool output as indented JSON text; the template escapes it like any other string."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


@login_required
def run_detail(request: HttpRequest, run_id: UUID) -> HttpResponse:
    tenant = current_tenant(request)
    run: Run = selectors.get_run(tenant=tenant, run_id=run_id)
    context = {
        "tenant": tenant,
        "run": run,
        # The timeline is part of the polled fragment, so it grows while the page is open.
        "steps": selectors.list_steps(run=run),
        "result_json": None if run.result is None else pretty_json(run.result),
    }
    if request.htmx:
        response = render(request, "runs/detail.html#progress", context)
        if run.is_terminal:
            response.status_code = HTMX_STOP_POLLING
        return response
    return render(request, "runs/detail.html", context)
