"""What PostgreSQL cannot store, found before it is sent: NUL, lone surrogates, NaN, too deep.

PostgreSQL refuses, with an error rather than a warning:

- a NUL character (U+0000) in ``text`` and in ``jsonb`` (where it is the
  escape ``\\u0000``), so in keys as well as values;
- a lone surrogate (U+D800 to U+DFFF), which has no UTF-8 encoding: Python's
  JSON parser lets one through from the escape ``"\\ud800"``, and psycopg can
  neither encode it as text nor PostgreSQL read it as jsonb;
- ``NaN`` and ``Infinity``, which JSON (and so ``jsonb``) has no literal for,
  although Python's ``json`` writes and reads them.

Nesting is bounded too: every recursive walk over a document (``json``,
pydantic, the templates' pretty printer, our own) must stay far from
Python's recursion limit, and no real input nests deeper than
``MAX_DEPTH``.

``find_unstorable`` checks untrusted input where it enters (the API schemas,
the dashboard's forms, ``runs.services.submit``) so that it is refused with a
readable reason; ``scrub`` makes text we must keep anyway (a model's or a
tool's output) storable by replacing what PostgreSQL refuses.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import Any

# Deeper than any real input or output of an agent; far enough below Python's
# default recursion limit (1000) for json, pydantic and the templates.
MAX_DEPTH = 64

REPLACEMENT = "\ufffd"
# NUL, and every surrogate code point: in a Python str a surrogate is always
# lone (the JSON parser joins a valid pair into one character).
_UNSTORABLE_CHARACTER = re.compile("[\x00\ud800-\udfff]")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CONTAINERS = (dict, list, tuple)


def find_unstorable(value: Any, *, max_depth: int = MAX_DEPTH, where: str = "value") -> str | None:
    """The first reason PostgreSQL would refuse ``value``, or None when it can be stored.

    Looks into dicts (keys and values), lists and tuples, to ``max_depth``
    levels of nesting, for text with a NUL character or a lone surrogate and
    for numbers that are not finite. The reason names where the problem is,
    starting from ``where``: ``"input.items[2]: contains a NUL character"``.
    It never repeats the offending text, so it is safe to show and to store.
    Other types are not judged (serialising them is the caller's business).
    Walks iteratively, so any depth is answered without a RecursionError.
    """
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return f"{path}: {problem}"
        elif isinstance(item, float | Decimal):
            if not _is_finite(item):
                return f"{path}: {item} is not a finite number"
        elif isinstance(item, _CONTAINERS):
            if depth >= max_depth:
                return f"{path}: nests deeper than {max_depth} levels"
            children: list[tuple[Any, str, int]] = []
            if isinstance(item, dict):
                for key, child in item.items():
                    if isinstance(key, str) and (problem := _text_problem(key)):
                        return f"{path}: a key {problem}"
                    children.append((child, _child_path(path, key), depth + 1))
            else:
                children = [
                    (child, f"{path}[{index}]", depth + 1) for index, child in enumerate(item)
                ]
            # Reversed, so that problems are reported in document order.
            stack.extend(reversed(children))
    return None


def scrub(value: Any) -> tuple[Any, bool]:
    """A storable copy of ``value`` and whether anything had to be replaced.

    NUL characters and lone surrogates, in strings and in dict keys, become
    U+FFFD (the replacement character); floats and Decimals that are not
    finite become None. Dicts, lists and tuples are copied at every level
    (tuples become lists, as JSON would make them); other values are kept
    as they are. Two keys that differ only in replaced characters collapse
    into one, the later value winning. Nesting is kept whatever its depth
    (``find_unstorable`` is the place to refuse it), and walked iteratively.
    """
    changed = False

    def clean(item: Any) -> Any:
        nonlocal changed
        if isinstance(item, str):
            if _UNSTORABLE_CHARACTER.search(item):
                changed = True
                return _UNSTORABLE_CHARACTER.sub(REPLACEMENT, item)
            return item
        if isinstance(item, float | Decimal) and not _is_finite(item):
            changed = True
            return None
        return item

    root: list[Any] = [None]
    # (source container, target container, key in the target)
    pending: list[tuple[Any, Any, Any]] = [(value, root, 0)]
    while pending:
        source, target, slot = pending.pop()
        if isinstance(source, dict):
            copy: dict = {}
            target[slot] = copy
            for key, child in source.items():
                key = clean(key)
                copy[key] = None
                pending.append((child, copy, key))
        elif isinstance(source, list | tuple):
            copy_list: list = [None] * len(source)
            target[slot] = copy_list
            for index, child in enumerate(source):
                pending.append((child, copy_list, index))
        else:
            target[slot] = clean(source)
    return root[0], changed


def _text_problem(text: str) -> str | None:
    found = _UNSTORABLE_CHARACTER.search(text)
    if found is None:
        return None
    character = found.group()
    if character == "\x00":
        return "contains a NUL character"
    return f"contains a lone surrogate (U+{ord(character):04X})"


def _is_finite(number: float | Decimal) -> bool:
    return number.is_finite() if isinstance(number, Decimal) else math.isfinite(number)


def _child_path(path: str, key: Any) -> str:
    if isinstance(key, str) and _IDENTIFIER.match(key):
        return f"{path}.{key}"
    shown = repr(key)
    return f"{path}[{shown if len(shown) <= 40 else shown[:37] + '...'}]"
