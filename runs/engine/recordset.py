"""A statement's table of parameters, declared once: the fields of a frozen dataclass.

A checkpoint or an exit of several runs is one statement over a table ``p``
of one row per run, sent as one JSON parameter and read back by
``json_to_recordset(%(rows)s::json) AS p(<columns>)`` (one parameter instead
of an array per column: psycopg adapts arrays in Python, element by
element, and a dozen of them cost a worker more than the rest of the
statement's Python). The columns are the value's fields, names and types:
its ``.sql`` statement says ``{{<name>}}`` where they go, filled in here when
the module that executes it loads (``fill``), and its rows are its values
(``rows``). A field that is not a column says so (``NOT_A_COLUMN``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

# A field's metadata that keeps it out of the statement (it is for Python only).
NOT_A_COLUMN = {"column": False}

_SQL_TYPES: dict[Any, str] = {
    UUID: "uuid",
    bool: "bool",
    int: "bigint",
    float: "float8",
    Decimal: "numeric",
    str: "text",
    datetime: "timestamptz",
    tuple[int, ...]: "bigint[]",
}


def _sql_type(annotation: Any) -> str:
    if isinstance(annotation, types.UnionType):  # X | None: the column is nullable anyway
        (annotation,) = (arg for arg in typing.get_args(annotation) if arg is not type(None))
    if isinstance(annotation, type) and issubclass(annotation, str) and annotation is not str:
        annotation = str  # RunStatus and the other TextChoices
    try:
        return _SQL_TYPES[annotation]
    except KeyError:
        raise TypeError(f"{annotation!r} has no column type of json_to_recordset rows") from None


def columns(cls: type) -> tuple[tuple[str, str], ...]:
    """``cls``'s columns: (name, SQL type) of each field that is one, in the fields' order."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (field.name, _sql_type(hints[field.name]))
        for field in dataclasses.fields(cls)
        if field.metadata.get("column", True)
    )


def fill(statement: str, name: str, cls: type) -> str:
    """``statement`` with ``{name}`` replaced by ``cls``'s column list; refuses one that does not say where."""
    placeholder = "{" + name + "}"
    if placeholder not in statement:
        raise ValueError(f"the statement has no {placeholder} for the columns of {cls.__name__}")
    return statement.replace(placeholder, ", ".join(f"{n} {t}" for n, t in columns(cls)))


def _default(value: Any) -> str:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, UUID | Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not a parameter type of json_to_recordset rows")


def rows(items: typing.Iterable[Any], names: tuple[str, ...]) -> str:
    """The items' columns (``names``, from ``columns()``) as one JSON text, one object per item."""
    return json.dumps(
        [{name: getattr(item, name) for name in names} for item in items],
        default=_default,
        separators=(",", ":"),
        allow_nan=False,
    )
