"""The CRM's Django tasks: plain ``@task`` functions, run by ``runworker`` (runs.tasks).

Enqueue from anywhere in the project, inside your own transaction if you like::

    from crm.tasks import pipeline_report
    result = pipeline_report.enqueue()
    pipeline_report.get_result(result.id).return_value   # once a worker ran it
"""

from __future__ import annotations

from django.db.models import Count
from django.tasks import task

from crm.models import Lead, Stage


@task
def pipeline_report() -> dict:
    """How many leads are at each stage of the pipeline."""
    counts = dict(Lead.objects.values_list("stage").annotate(n=Count("id")).order_by())
    return {stage: counts.get(stage, 0) for stage in Stage.values}
