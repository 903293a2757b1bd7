"""Fixtures of the webhook tests: real receivers on loopback, and the setting that lets webhooks reach them."""

import pytest

from tests.support.webhook_receiver import Receiver, Tarpit


@pytest.fixture
def receiver():
    """An HTTP receiver on loopback that verifies every delivery; stopped at teardown."""
    server = Receiver()
    yield server
    server.stop()


@pytest.fixture
def tarpit():
    """A receiver that accepts connections and never answers; stopped at teardown."""
    server = Tarpit()
    yield server
    server.stop()


@pytest.fixture
def private_allowed(settings):
    """Webhooks may go to private addresses (loopback, where the receivers listen)."""
    settings.RUNS_WEBHOOKS_ALLOW_PRIVATE = True
    return settings
