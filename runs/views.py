"""The minimal dashboard: the tenant's runs and a run page whose progress polls every 2 s."""

from __future__ import annotations

from uuid import UUID

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from runs import selectors
from runs.models import Membership, Tenant

# htmx stops polling when a response has this status (a terminal run).
HTMX_STOP_POLLING = 286


def current_tenant(request: HttpRequest) -> Tenant:
    membership = (
        Membership.objects.select_related("tenant").filter(user=request.user).order_by("tenant__slug").first()
    )
    if membership is None:
        raise Http404("you are not a member of any tenant")
    return membership.tenant


@login_required
def run_list(request: HttpRequest) -> HttpResponse:
    tenant = current_tenant(request)
    page = selectors.list_runs(tenant=tenant, limit=50, cursor=request.GET.get("cursor") or None)
    return render(request, "runs/list.html", {"tenant": tenant, "page": page})


@login_required
def run_detail(request: HttpRequest, run_id: UUID) -> HttpResponse:
    tenant = current_tenant(request)
    run = selectors.get_run(tenant=tenant, run_id=run_id)
    if request.htmx:
        response = render(request, "runs/detail.html#progress", {"run": run})
        if run.is_terminal:
            response.status_code = HTMX_STOP_POLLING
        return response
    steps = selectors.list_steps(run=run)
    return render(request, "runs/detail.html", {"tenant": tenant, "run": run, "steps": steps})
