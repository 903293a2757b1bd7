"""The operations console (docs/how-to/operations.md) in the Django admin.

ModelAdmins for runs and steps (``run``), tenants, keys and memberships
(``tenancy``), workers, queues and kinds (``fleet``), webhook endpoints and
deliveries (``webhooks``); the actions call the services (``run_actions``),
asking first where they cancel or decide (``confirmations``); the overview
page lives in ``overview``, its throughput chart in ``chart``. The templates
are under templates/admin/, the stylesheet is static/css/admin-extra.css.
"""

from runs.admin import (  # noqa: F401  (importing registers the ModelAdmins)
    fleet,
    run,
    schedules,
    tenancy,
    threads,
    webhooks,
)
