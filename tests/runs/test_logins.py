"""Logins against a real `manage.py serve`: throttled per username and address, strong passwords only, and a
cap on password checks in progress (issue 25, finding 5).
"""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError

from tests.conftest import free_port
from tests.support.factories import UserFactory
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "secret-pass"  # tests.support.factories.UserFactory's


def attempts():
    """django-axes' failure records (imported late: the app is what these tests look for)."""
    from axes.models import AccessAttempt

    return AccessAttempt.objects


def serve(processes, **env) -> str:
    port = free_port()
    processes.manage("serve", f"127.0.0.1:{port}", **env)
    base = f"http://127.0.0.1:{port}"

    def up():
        try:
            return httpx.get(base + "/api/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout=30, what="the web server to answer")
    return base


class Browser:
    """One client of the login form: its CSRF cookie and token, read from the form as a browser would."""

    def __init__(self, base: str, path: str = "/accounts/login/"):
        self.url = base + path
        self.client = httpx.Client(timeout=30)
        form = self.client.get(self.url)
        assert form.status_code == 200
        self.csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text).group(1)

    def login(self, username: str, password: str) -> httpx.Response:
        return self.client.post(
            self.url,
            data={
                "username": username,
                "password": password,
                "csrfmiddlewaretoken": self.csrf,
                "next": "/",
            },
        )


@pytest.fixture
def base(processes):
    return serve(processes)


def test_twenty_five_wrong_passwords_lock_the_username_at_that_address_even_for_the_right_one(base):
    user = UserFactory()
    browser = Browser(base)

    answers = [browser.login(user.username, f"guess-{n}").status_code for n in range(25)]
    right = browser.login(user.username, PASSWORD)

    assert answers[:4] == [200] * 4  # the form again, with its error
    assert set(answers[4:]) == {429}  # the fifth failure locks
    assert right.status_code == 429
    assert "Too many failed logins" in right.text and "15 minutes" in right.text
    assert int(right.headers["Retry-After"]) == 15 * 60
    # Counted as five failures: the refused attempts never reached a password check.
    assert attempts().get(username=user.username).failures_since_start == 5
    # Keyed on username and address: another account at the same address still logs in.
    other = UserFactory()
    assert Browser(base).login(other.username, PASSWORD).status_code == 302


def test_the_admin_login_is_throttled_too(base):
    staff = UserFactory(is_staff=True)
    browser = Browser(base, "/admin/login/")

    answers = [browser.login(staff.username, "wrong").status_code for _ in range(6)]
    right = browser.login(staff.username, PASSWORD)

    assert answers == [200] * 4 + [429, 429]
    assert right.status_code == 429 and "Too many failed logins" in right.text


def test_a_right_password_before_the_limit_logs_in_and_clears_the_failures(base):
    user = UserFactory()
    browser = Browser(base)

    assert [browser.login(user.username, "wrong").status_code for _ in range(4)] == [200] * 4
    assert browser.login(user.username, PASSWORD).status_code == 302
    assert not attempts().filter(username=user.username).exists()


@pytest.mark.parametrize("weak", ["password", "12345678", "qwertyuiop", "user-name-1"])
def test_weak_passwords_fail_validation(weak):
    user = UserFactory.build(username="user-name-1", email="someone@example.com")

    with pytest.raises(ValidationError):
        validate_password(weak, user)


def test_a_strong_password_passes_validation():
    validate_password("correct horse battery staple 7", UserFactory.build())


def test_logins_beyond_the_concurrency_cap_are_refused_at_once_and_not_counted(processes):
    base = serve(processes, RUNS_LOGIN_CONCURRENCY="1")
    browser = Browser(base)
    start = threading.Barrier(12)
    answers: list[httpx.Response] = []

    def attempt(n: int) -> None:
        start.wait()
        answers.append(browser.login(f"nobody-{n}", "wrong"))  # unknown names are hashed too

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    busy = [r for r in answers if r.status_code == 503]
    checked = [r for r in answers if r.status_code == 200]
    assert len(busy) + len(checked) == 12, sorted(r.status_code for r in answers)
    assert busy and checked
    assert all(r.headers["Retry-After"] == "1" and "The server is busy" in r.text for r in busy)
    # Only the checked attempts count as failures; a busy answer locks nobody out.
    assert attempts().count() == len(checked)
