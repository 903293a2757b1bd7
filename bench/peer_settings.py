"""Django settings for django-tasks-db in bench/peers.py: only its app, its backend, and the bench database.

``DATABASE_URL`` is the peer's own bench database. Connections come from
Django's psycopg 3 pool, as in this project's settings, so the worker's
``close_old_connections()`` between tasks hands a connection back instead
of reconnecting.
"""

from __future__ import annotations

import os

import dj_database_url

from bench.common import BENCH_SECRET_KEY

SECRET_KEY = os.environ.get("SECRET_KEY") or BENCH_SECRET_KEY
DEBUG = False
ALLOWED_HOSTS: list[str] = []
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django_tasks_db"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_db = dj_database_url.parse(os.environ["DATABASE_URL"], conn_max_age=0)
_db.setdefault("OPTIONS", {})["pool"] = {"min_size": 1, "max_size": 4}
DATABASES = {"default": _db}

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

LOGGING = {"version": 1, "disable_existing_loggers": False, "root": {"level": "WARNING"}}
