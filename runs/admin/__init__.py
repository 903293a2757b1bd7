"""The operations console (DESIGN §9) in the Django admin.

ModelAdmins for runs and steps (``run``), tenants, keys and memberships
(``tenancy``), workers, queues and kinds (``fleet``), webhook endpoints and deliveries
(``webhooks``); the actions call the
services (``run_actions``); the overview page lives in ``overview``.
"""

from runs.admin import fleet, run, tenancy, webhooks  # noqa: F401  (importing registers the ModelAdmins)
