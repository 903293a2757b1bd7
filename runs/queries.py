"""Every raw statement of the run domain, by name, with its whole text in one ``.sql`` file.

The engine's statements (the claim, checkpoints, exits, timers, the
reaper...) are raw SQL because the ORM cannot say them: CTEs that update,
insert and lock in one round trip. Following Procrastinate's
``queries.sql``, each lives in ``runs/sql/<area>.sql`` under a header
line, with the comment that says why it is written the way it is::

    -- name: wake_due
    -- Waiting runs whose timer is due go back to the queue ...
    WITH r AS (UPDATE runs_run ... RETURNING id, tenant_id, queue, last_event_seq),
    new_events AS (SELECT r.id AS run_id, r.last_event_seq AS seq, ... FROM r),
    {outbox}
    SELECT queue, count(*) AS n FROM r GROUP BY queue

A statement reads from top to bottom as PostgreSQL runs it. What is filled
in at load time is named, never assembled:

- status literals, ``{queued}``, ``{running}``, ``{step_done}``, ``{terminal}``
  ... from ``RunStatus`` and ``StepStatus`` (``runs.db.sql``);
- fragments, ``-- fragment: <name>`` blocks, which may use each other: in
  ``runs/sql/fragments.sql`` the outbox's CTEs that turn a statement's
  ``new_events`` into Events (``{outbox}``), and also into webhook
  deliveries for the types webhooks are sent for (``{outbox_and_webhooks}``);
  beside their statements, what the two variants of the claim and of the
  exit share (``runs/sql/claim.sql``, ``runs/sql/exit.sql``). A statement
  says which one it needs; nothing is decided by reading its text.

``%(param)s`` placeholders stay for the driver. Rows are read by column
name (``one``, ``rows``), never by position: a statement's ``SELECT`` list
is its return type.

A name asked for that no file declares, a name declared twice, or a
``{placeholder}`` that is neither a literal nor a fragment is an error when
this module is imported, not when the statement first runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from runs.db import sql

SQL_DIR = Path(__file__).resolve().parent / "sql"

_HEADER = re.compile(r"^-- (name|fragment): ([a-z_][a-z0-9_]*)\s*$")


class StatementError(Exception):
    """A ``.sql`` file declares a statement twice, or a statement names a placeholder that nothing fills."""


def _blocks(path: Path) -> list[tuple[str, str, str]]:
    """(kind, name, text) for each ``-- name:`` or ``-- fragment:`` block of one file."""
    blocks: list[tuple[str, str, list[str]]] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        header = _HEADER.match(line)
        if header:
            blocks.append((header.group(1), header.group(2), []))
        elif blocks:
            blocks[-1][2].append(line)
        elif line.strip() and not line.startswith("--"):
            raise StatementError(f"{path.name}:{number}: text before the first '-- name:' line")
    return [(kind, name, "\n".join(lines).strip() + "\n") for kind, name, lines in blocks]


def _body(text: str) -> str:
    """The statement without its leading comment lines (the why, for readers; the server needs none)."""
    lines = text.splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "\n".join(lines).strip()


class Queries:
    """The statements of ``runs/sql/*.sql`` by name: ``queries.wake_due`` is its text, ready to execute."""

    def __init__(self, directory: Path = SQL_DIR) -> None:
        fragments: dict[str, str] = {}
        statements: dict[str, tuple[str, str]] = {}  # name: (file, text)
        seen: dict[str, str] = {}
        for path in sorted(directory.glob("*.sql")):
            for kind, name, text in _blocks(path):
                if name in seen:
                    raise StatementError(
                        f"{name} is declared in {seen[name]} and again in {path.name}"
                    )
                seen[name] = path.name
                if kind == "fragment":
                    fragments[name] = _body(text)
                else:
                    statements[name] = (path.name, _body(text))
        filled: dict[str, str] = {}
        waiting = dict(fragments)
        while waiting:  # a fragment may use other fragments, wherever they are declared
            ready = {
                name: text
                for name, text in waiting.items()
                if not any(f"{{{other}}}" in text for other in waiting if other != name)
            }
            if not ready:
                raise StatementError(f"fragments that use each other: {', '.join(sorted(waiting))}")
            for name, text in ready.items():
                filled[name] = self._fill(f"fragment {name}", text, filled)
                del waiting[name]
        self._fragments = filled
        self._statements = {
            name: self._fill(f"{file}: {name}", text, filled)
            for name, (file, text) in statements.items()
        }

    @staticmethod
    def _fill(where: str, text: str, fragments: dict[str, str]) -> str:
        try:
            return sql(text, **fragments)
        except (KeyError, IndexError, ValueError) as exc:
            raise StatementError(f"{where}: no status literal or fragment is named {exc}") from None

    def __getattr__(self, name: str) -> str:
        try:
            return self.__dict__["_statements"][name]
        except KeyError:
            raise AttributeError(f"no statement named {name!r} in runs/sql/*.sql") from None

    def names(self) -> list[str]:
        return sorted(self._statements)

    def fragment(self, name: str) -> str:
        """A fragment's text as statements get it (for tests that hold it to the Python it mirrors)."""
        return self._fragments[name]


queries = Queries()


def one(cursor) -> dict[str, Any] | None:
    """The statement's first row as a dict keyed by column name, or None when it returned none."""
    row = cursor.fetchone()
    if row is None or isinstance(row, dict):  # the engine's cursor makes dicts (runs.driver)
        return row
    return dict(zip([column.name for column in cursor.description], row, strict=True))


def single(cursor) -> dict[str, Any]:
    """The row of a statement that always returns one (an aggregate, an upsert's RETURNING); LookupError if none."""
    row = one(cursor)
    if row is None:
        raise LookupError("the statement returned no row")
    return row


def rows(cursor) -> list[dict[str, Any]]:
    """Every row the statement returned, each a dict keyed by column name."""
    found = cursor.fetchall()
    if not found or isinstance(found[0], dict):  # the engine's cursor makes dicts (runs.driver)
        return found
    names = [column.name for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in found]
