"""pytest plugin (``-p config.testdb``): the test session is an entry point.

pytest imports ``-p`` plugins before pytest-django configures Django, so the
embedded server is started (when ``DATABASE_URL`` is unset) before the
settings are read, and worker processes started by tests inherit the URL.
"""

import os

from config.dbserver import ensure_database_url

os.environ.setdefault(
    "AGENT_MODULES",
    "tests.support.agents,tests.support.agents_control,tests.support.agents_llm,tests.support.agents_edges,tests.support.agents_streams,tests.support.agents_workflows,tests.support.agents_step_options,tests.support.agents_payloads,tests.support.agents_threads",
)
# The example kinds and demo apps (examples/): many tests run them. Tests of a deployment without them
# start their processes with RUNS_EXAMPLES=0 (tests/runs/test_kinds.py).
os.environ.setdefault("RUNS_EXAMPLES", "1")
# One test database per session, so that concurrent sessions on one server
# (a developer's and CI's, or parallel checkouts) never collide.
os.environ.setdefault("RUNS_TEST_DATABASE", f"test_agentruns_{os.getpid()}")
# The tests run with DEBUG off, as production does, but over plain HTTP and
# with a key of their own (without one, settings refuse to start).
os.environ.setdefault("SECRET_KEY", "test-insecure-not-a-secret-7f3a9c1e5b2d8046aa91c3e7f05b6d24")
# Processes started by tests log readable lines (tests look for " ERROR " in them); the JSON
# format has tests of its own (tests/config/test_logging.py).
os.environ.setdefault("RUNS_LOG_FORMAT", "console")
for name in (
    "SECURE_SSL_REDIRECT",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "SECURE_HSTS_SECONDS",
):
    os.environ.setdefault(name, "0")
ensure_database_url()
