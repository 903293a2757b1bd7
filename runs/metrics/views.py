"""``GET /metrics`` behind a Bearer token (``RUNS_METRICS_TOKEN``); without one configured it does not exist."""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_safe
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from runs.metrics.scrape import render


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    token = settings.RUNS_METRICS_TOKEN
    if not token:
        raise Http404("metrics are off (RUNS_METRICS_TOKEN is not set)")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(
        given.strip().encode(), token.encode()
    ):
        return JsonResponse(
            {"detail": "send the metrics token as 'Authorization: Bearer <RUNS_METRICS_TOKEN>'"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
        )
    return HttpResponse(
        render(), content_type=CONTENT_TYPE_PLAIN_0_0_4
    )  # what every Prometheus version reads
