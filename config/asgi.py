"""The application ``manage.py serve`` runs: event streams on the event loop, every other request on WSGI.

Only the event streams (``GET /api/runs/{id}/events``, ``GET /api/threads/{id}/events``) need ASGI: each
holds its connection open for minutes while waiting on the process's hub,
and a thread per stream would not do. Every other request is ordinary sync
Django (a submit, a dashboard page, the admin). Under Django's ASGI handler
such a request crosses between the event loop and threads at every
sync-only middleware and again for the view: about a dozen thread hand-offs
per request, which cost ``POST /api/runs`` more CPU than the submit itself.
Here it is handed to a thread once and runs Django's WSGI handler there
(``a2wsgi``, the maintained ASGI-to-WSGI bridge), middleware and view in
one go, as under any WSGI server.

Around both, ``config.body_limit`` refuses a body over
``DATA_UPLOAD_MAX_MEMORY_SIZE`` (``RUNS_MAX_BODY_BYTES``) before any of it
is read, and any body at all on the event stream.
"""

import os
import re

from a2wsgi import WSGIMiddleware
from django.conf import settings
from django.core.asgi import get_asgi_application
from django.core.wsgi import get_wsgi_application

from config.body_limit import BodyLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

streams = get_asgi_application()
# A thread per request in progress, as many as the process's database pool
# has connections (RUNS_DB_POOL_MAX): one more would only wait for a connection.
_pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
requests = WSGIMiddleware(
    get_wsgi_application(),  # type: ignore[arg-type]  # a2wsgi and django-stubs type environ, start_response apart
    workers=_pool["max_size"] if isinstance(_pool, dict) else 12,
)

STREAM_PATH = re.compile(r"^/api/(runs|threads)/[^/]+/events/?$")


async def dispatch(scope, receive, send):
    if scope["type"] == "http" and not STREAM_PATH.match(scope["path"]):
        return await requests(scope, receive, send)
    return await streams(scope, receive, send)


application = BodyLimit(
    dispatch, limit=settings.DATA_UPLOAD_MAX_MEMORY_SIZE, bodyless_paths=STREAM_PATH
)
