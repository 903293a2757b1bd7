"""A per-process cap on password checks, so that a login storm cannot take the web process's threads and CPU.

Checking a password is slow on purpose (PBKDF2 with over a million
iterations, about half a second of a core) and so is checking one for a
username that does not exist (Django hashes anyway, so that the answer's
timing tells nothing). Two dozen logins at once would hold every request
thread of ``manage.py serve`` (RUNS_DB_POOL_MAX) and every core for
seconds, and the API's requests would wait behind them.

``CappedModelBackend`` is Django's ``ModelBackend`` that checks at most
``RUNS_LOGIN_CONCURRENCY`` passwords at once in this process: one more
does not wait (that would hold its thread all the same) but raises
``LoginsBusy`` at once, before hashing, which ``LoginsBusyMiddleware``
answers with 503 and ``Retry-After``. The exception leaves
``authenticate()`` before it sends ``user_login_failed``, so django-axes
does not count a busy answer as a wrong password. Hand-written: the
throttling libraries count requests per client over time; this bounds
work in progress, which no time window can.
"""

from __future__ import annotations

import threading

from axes.helpers import get_cool_off
from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.shortcuts import render

# Seconds a refused login is told to wait: about one password check.
RETRY_AFTER_SECONDS = 1

_slots: threading.BoundedSemaphore | None = None
_slots_lock = threading.Lock()


class LoginsBusy(Exception):
    """Every password-check slot of this process is taken."""


def _semaphore() -> threading.BoundedSemaphore:
    global _slots
    if _slots is None:
        with _slots_lock:
            if _slots is None:
                _slots = threading.BoundedSemaphore(max(1, settings.RUNS_LOGIN_CONCURRENCY))
    return _slots


class CappedModelBackend(ModelBackend):
    def authenticate(self, request, username=None, password=None, **kwargs):
        if password is None:
            return None  # nothing to hash: not a password login
        slots = _semaphore()
        if not slots.acquire(blocking=False):
            raise LoginsBusy
        try:
            return super().authenticate(request, username=username, password=password, **kwargs)
        finally:
            slots.release()


def locked_out(request, original_response=None, credentials=None):
    """django-axes' answer to a username and address that failed too often (AXES_LOCKOUT_CALLABLE): 429."""
    cool_off = get_cool_off(request)
    seconds = int(cool_off.total_seconds()) if cool_off else 0
    response = render(
        request,
        "registration/locked_out.html",
        {"minutes": max(1, round(seconds / 60)), "failure_limit": settings.AXES_FAILURE_LIMIT},
        status=429,
    )
    if seconds:
        response["Retry-After"] = str(seconds)
    return response


class LoginsBusyMiddleware:
    """Answers a login that found no free slot: 503, ``Retry-After``, a page that says to try again."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, LoginsBusy):
            return None
        response = render(
            request,
            "registration/login_busy.html",
            {"retry_after": RETRY_AFTER_SECONDS},
            status=503,
        )
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return response
