"""A statement's table of parameters: written in the statement, mirrored by the fields of the value it carries.

A checkpoint or an exit of several runs is one statement over a table ``p``
of one row per run, sent as one JSON parameter and read by
``json_to_recordset(%(rows)s::json) AS p(<name> <type>, ...)`` (one
parameter instead of an array per column: psycopg adapts arrays in Python,
element by element, and a dozen of them cost a worker more than the rest of
the statement's Python). That column list is written in the ``.sql`` file;
the frozen dataclass of the value the statement writes
(``runs.engine.exit.Exit``, ``runs.engine.steps.Checkpoint``) mirrors it
with ordinary typed fields, in the same order, so that the type checker
sees them, and ``row_of(statement)`` checks the two equal when the class is
made, at import: name, order and type of each column (a ``text`` column is
a ``str`` or a ``str`` enum, optionally ``| None``; see ``_TYPES``), or a
TypeError naming the difference. A field marked ``metadata=PYTHON_ONLY`` is
Python's alone, never sent; ``rows()`` turns such values into the
parameter, their columns only.
"""

from __future__ import annotations

import dataclasses
import json
import operator
import re
import types
import typing
from collections.abc import Callable, Iterable
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Any, ClassVar
from uuid import UUID

_TYPES: dict[str, type] = {
    "uuid": UUID,
    "bool": bool,
    "int": int,
    "bigint": int,
    "float8": float,
    "numeric": Decimal,
    "text": str,
    "timestamptz": datetime,
}

# The metadata of a field of Python's alone: ``field(default=None, metadata=PYTHON_ONLY)``.
PYTHON_ONLY = types.MappingProxyType({"sent": False})

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
    """The base of a value written as one row of ``p``; its class is checked by ``row_of``."""

    # The names of the columns of p, in their order: set by row_of, absent from a class it did not check.
    COLUMNS: ClassVar[tuple[str, ...]]


def row_of[R: Row](statement: str) -> Callable[[type[R]], type[R]]:
    """The class decorator, above ``@dataclass``, of a value written as one row of ``statement``'s ``p``.

    Raises TypeError, naming each difference, unless the class's fields,
    those of Python's alone (``metadata=PYTHON_ONLY``) left out, are the
    columns of ``p``: the same names, in the same order, each of the Python
    type its column is read as (``_TYPES``; an enum of it will do),
    optionally ``| None``. Sets the class's ``COLUMNS``, which ``rows()``
    sends.
    """
    declared = columns(statement)

    def check(cls: type[R]) -> type[R]:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"{cls.__qualname__} is not a dataclass: row_of goes above @dataclass")
        hints = typing.get_type_hints(cls)
        fields = [f.name for f in dataclasses.fields(cls) if f.metadata.get("sent", True)]
        names = [name for name, _ in declared]
        differences = []
        missing = [name for name in names if name not in fields]
        if missing:
            differences.append(f"no field for the column(s) {', '.join(missing)}")
        extra = [name for name in fields if name not in names]
        if extra:
            differences.append(
                f"the field(s) {', '.join(extra)} are no column (one of Python's alone is"
                " marked metadata=PYTHON_ONLY)"
            )
        if not missing and not extra and fields != names:
            differences.append(f"the fields are in the order {', '.join(fields)}")
        for name, sql_type in declared:
            if name in fields and not _carries(hints[name], _TYPES[sql_type]):
                wanted = _TYPES[sql_type].__name__
                differences.append(
                    f"the field {name} is {_spelt(hints[name])}, its column {sql_type} ({wanted})"
                )
        if differences:
            raise TypeError(
                f"{cls.__qualname__} is not a row of p({', '.join(f'{n} {t}' for n, t in declared)}):"
                f" {'; '.join(differences)}"
            )
        cls.COLUMNS = tuple(names)
        return cls

    return check


def _spelt(hint: object) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _carries(hint: object, python_type: type) -> bool:
    """Whether a field of type ``hint`` holds a column read as ``python_type``: that or an enum of it, or None."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [option for option in typing.get_args(hint) if option is not types.NoneType]
        if len(options) != 1:
            return False
        hint = options[0]
    if hint is python_type:
        return True
    return isinstance(hint, type) and issubclass(hint, Enum) and issubclass(hint, python_type)


def _default(value: Any) -> Any:
    # Most frequent first: every row has a run id and a time.
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, Enum):  # a str enum is encoded as a str before it gets here
        return value.value
    raise TypeError(f"{type(value).__name__} is not a parameter type of json_to_recordset rows")


# One encoder for every call (json.dumps with arguments makes a new one each time).
_ENCODER = json.JSONEncoder(default=_default, separators=(",", ":"), allow_nan=False)


def rows(items: Iterable[Row]) -> str:
    """The parameter of the statement the items' class was checked against: one JSON object of its columns per item."""
    found = list(items)
    if not found:
        return "[]"
    names = found[0].COLUMNS
    if len(names) == 1:
        return _ENCODER.encode([{names[0]: getattr(item, names[0])} for item in found])
    values = operator.attrgetter(*names)  # the columns of an item, as a tuple, in one call
    return _ENCODER.encode([dict(zip(names, values(item), strict=True)) for item in found])
