"""Fixtures of the admin's tests: the operator, a staff member who runs the operations console."""

import pytest

from tests.support.admin_helpers import ACTION_PERMISSIONS, staff_user


@pytest.fixture
def operator(db):
    """A staff member (not a superuser) with the view and action permissions on runs."""
    return staff_user("view_run", "view_step", *ACTION_PERMISSIONS)


@pytest.fixture
def operator_client(client, operator):
    """The admin test client logged in as the operator."""
    client.force_login(operator)
    return client
