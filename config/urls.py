from django.contrib import admin
from django.urls import include, path, re_path

from config.api import api, not_found
from runs.metrics.views import metrics

urlpatterns = [
    path("api/", api.urls),
    re_path(r"^api/", not_found),  # the rest of /api/ answers JSON too
    path("metrics", metrics, name="metrics"),  # Prometheus, with RUNS_METRICS_TOKEN (runs.metrics)
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("runs.dashboard.urls")),
]

# A signed-in user who belongs to no tenant gets a page that says so (runs.dashboard.access.NoMembership).
handler403 = "runs.dashboard.views.permission_denied"
