"""A statement's table of parameters, declared once: in the statement, read from there by the value it carries.

A checkpoint or an exit of several runs is one statement over a table ``p``
of one row per run, sent as one JSON parameter and read by
``json_to_recordset(%(rows)s::json) AS p(<name> <type>, ...)`` (one
parameter instead of an array per column: psycopg adapts arrays in Python,
element by element, and a dozen of them cost a worker more than the rest of
the statement's Python). That column list, in the ``.sql`` file, is the one
declaration: ``Row.of(statement)`` makes the frozen dataclass whose fields
are those columns, in that order, for the value that is written by the
statement to subclass (``runs.engine.exit.Exit``,
``runs.engine.steps.Checkpoint``), and ``rows()`` turns such values into the
parameter. A field the subclass adds is Python's alone, never sent.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

_TYPES: dict[str, Any] = {
    "uuid": UUID,
    "bool": bool,
    "int": int,
    "bigint": int,
    "float8": float,
    "numeric": Decimal,
    "text": str,
    "timestamptz": datetime,
}
# What a column is when a value does not say: a flag is off, a number of seconds zero, the rest unknown.
_BLANK: dict[Any, Any] = {bool: False, float: 0.0}

_RECORDSET = re.compile(r"json_to_recordset\(%\(rows\)s::json\)\s+AS\s+p\(([^()]*)\)", re.S)


def columns(statement: str) -> tuple[tuple[str, str], ...]:
    """(name, SQL type) of each column of the statement's ``p``, in their order."""
    found = _RECORDSET.search(statement)
    if found is None:
        raise ValueError("the statement reads no json_to_recordset(%(rows)s::json) AS p(...)")
    pairs = []
    for column in found.group(1).split(","):
        name, sql_type = column.split()
        if sql_type not in _TYPES:
            raise ValueError(f"column {name} of p has a type rows cannot carry: {sql_type}")
        pairs.append((name, sql_type))
    return tuple(pairs)


class Row:
    """The base of a value written as one row of ``p``: ``class Exit(Row.of(queries.leave_running))``."""

    COLUMNS: tuple[str, ...] = ()

    @classmethod
    def of(cls, statement: str) -> type[Row]:
        """A frozen dataclass whose fields are the columns of ``statement``'s ``p`` (defaults: blank)."""
        declared = columns(statement)
        fields = []
        for name, sql_type in declared:
            python_type = _TYPES[sql_type]
            default = _BLANK.get(python_type)
            fields.append((name, python_type | None, dataclasses.field(default=default)))
        base = dataclasses.make_dataclass("Columns", fields, bases=(cls,), frozen=True)
        base.COLUMNS = tuple(name for name, _ in declared)
        return base


def _default(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not a parameter type of json_to_recordset rows")


def rows(items: Iterable[Row]) -> str:
    """The parameter of the statement the items' class was made of: one JSON object of columns per item."""
    return json.dumps(
        [{name: getattr(item, name) for name in item.COLUMNS} for item in items],
        default=_default,
        separators=(",", ":"),
        allow_nan=False,
    )
