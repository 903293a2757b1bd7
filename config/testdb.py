"""pytest plugin (``-p config.testdb``): the test session is an entry point.

pytest imports ``-p`` plugins before pytest-django configures Django, so the
embedded server is started (when ``DATABASE_URL`` is unset) before the
settings are read, and worker processes started by tests inherit the URL.
"""

import os

from config.dbserver import ensure_database_url

os.environ.setdefault("AGENT_MODULES", "tests.agents,tests.agents_control,tests.agents_llm,tests.agents_edges")
# One test database per session, so that concurrent sessions on one server
# (a developer's and CI's, or parallel checkouts) never collide.
os.environ.setdefault("RUNS_TEST_DATABASE", f"test_agentruns_{os.getpid()}")
ensure_database_url()
