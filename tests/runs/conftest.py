"""Fixtures of the tests of runs/: a person acting through the API, and the check that nothing was written."""

import pytest

from runs.models import Event, Run
from tests.support.control_helpers import Person


@pytest.fixture
def api_person(tenant):
    """An API key of the tenant with every scope (named "ops") and a client sending it."""
    return Person(tenant, "ops")


@pytest.fixture
def no_new_runs(db):
    """Fails the test if it leaves any run or event behind (no half-written submits)."""
    yield
    assert Run.objects.count() == 0
    assert Event.objects.count() == 0
