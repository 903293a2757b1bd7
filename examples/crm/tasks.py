"""The CRM's Django tasks: plain ``@task`` functions, run by ``runworker`` (runs.tasks).

Enqueue from anywhere in the project, inside your own transaction if you like::

    from examples.crm.tasks import pipeline_report
    result = pipeline_report.enqueue("demo")   # one tenant's pipeline (no argument: every tenant's)
    pipeline_report.get_result(result.id).return_value   # once a worker ran it
"""

from __future__ import annotations

from django.db.models import Count
from django.tasks import task

from examples.crm.models import Lead, Stage


@task
def pipeline_report(tenant: str | None = None) -> dict:
    """How many leads are at each stage of the pipeline: of the tenant with this slug, or of every tenant.

    Code enqueues it; a tenant cannot start a task kind (runs.kinds), so none asks for another's counts.
    """
    leads = Lead.objects.all() if tenant is None else Lead.objects.filter(tenant__slug=tenant)
    counts = dict(leads.values_list("stage").annotate(n=Count("id")).order_by())
    return {stage: counts.get(stage, 0) for stage in Stage.values}
