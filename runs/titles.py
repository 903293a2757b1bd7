"""What a run is called and what it says of itself: its title, from its input, and one-line texts.

A run's ``title`` is computed once, at submit (``runs.services.submit``),
from its validated input: by the kind's ``title=`` when it declares one (a
callable of the input dict, or the name of an input field), else from the
first string field. Its ``summary`` is what its agent reported
(``ctx.report``). Both come from untrusted text (a client's input, a
model's words) and both are shown in one line of a list, so both go
through ``one_line``.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runs.registry import AgentKind

logger = logging.getLogger(__name__)

TITLE_MAX = 200  # Run.title
SUMMARY_MAX = 300  # Run.summary
ELLIPSIS = "…"

# Control characters (C0, DEL, C1) become spaces; lone surrogates, which have
# no UTF-8 encoding, and the bidirectional overrides and isolates, which
# would let a text reorder what is shown after it, are dropped.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_DROPPED = re.compile("[\ud800-\udfff\u202a-\u202e\u2066-\u2069]")


def one_line(text: str, *, limit: int) -> str:
    """``text`` as one storable, bounded line: controls and runs of whitespace become one space.

    NUL and the other control characters, line breaks included, turn into
    spaces; lone surrogates and bidirectional overrides are removed; the
    result is stripped and, when longer than ``limit`` characters, cut to
    ``limit`` with a trailing ellipsis. Never raises for any ``str``.
    """
    text = _DROPPED.sub("", _CONTROL.sub(" ", text))
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + ELLIPSIS


def default_title(data: Any) -> str:
    """The input in a few words: its first non-blank string field, or the first item of a list of strings."""
    if isinstance(data, dict):
        for value in data.values():
            if isinstance(value, list) and value and isinstance(value[0], str) and value[0].strip():
                more = len(value) - 1
                value = value[0] + (f" (+{more} more)" if more else "")
            if isinstance(value, str) and value.strip():
                return one_line(value, limit=TITLE_MAX)
    return ""


def title_for(kind: AgentKind, data: Any) -> str:
    """The title of a run of ``kind`` with the validated input ``data`` (see the module's docstring).

    A ``title=`` callable that raises, or returns something other than
    text, does not lose the run: the error is logged and the default title
    is used. A named field that is missing or blank falls back the same way.
    """
    spec = kind.title
    if spec is None:
        return default_title(data)
    if callable(spec):
        try:
            value = spec(data)
        except Exception:
            logger.exception("the title of kind %s raised; using the default title", kind.name)
            return default_title(data)
        if not isinstance(value, str):
            logger.warning(
                "the title of kind %s returned %s, not text; using the default title",
                kind.name,
                type(value).__name__,
            )
            return default_title(data)
        return one_line(value, limit=TITLE_MAX) or default_title(data)
    field = data.get(spec) if isinstance(data, dict) else None
    if isinstance(field, int | float) and not isinstance(field, bool):
        field = str(field)
    return default_title({spec: field}) or default_title(data)
