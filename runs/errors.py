"""What a tenant is shown of an error: its exception lines, without frames or the server's paths.

Runs and steps store the whole error (``Name: message`` then the traceback,
workers.recording) for operators, who read it in the admin. A traceback
tells a tenant how the server is laid out (its absolute paths, its code),
so every tenant-facing read (the API's run and step JSON, the dashboard,
event streams, webhooks) passes the stored text through ``tenant_error``.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from functools import cache

from django.conf import settings

_TRACEBACK = re.compile(r"^[\s|+]*(?:Exception Group )?Traceback \(most recent call last\):")
# A frame line; also a fragment of one where the stored text was cut (the last 8000 characters, or 500).
_FRAME = re.compile(r'^[\s|+]*File "|", line \d+')
_CHAIN = ("The above exception was the direct cause", "During handling of the above exception")


def tenant_error(text: str | None) -> str:
    """``text`` without tracebacks (their exception lines stay) and with the server's directories removed."""
    if not isinstance(text, str) or not text:
        return ""
    if "Traceback (most recent call last)" in text or _FRAME.search(text):
        text = _without_frames(text)
    return _without_paths(text).strip()


def _without_frames(text: str) -> str:
    kept: list[str] = []
    in_frames = False
    for line in text.splitlines():
        if _TRACEBACK.match(line) or _FRAME.search(line):
            in_frames = True
            continue
        if in_frames and (line.startswith((" ", "\t")) or not line.strip()):
            continue  # a frame's source line, its ^^^ markers, the blank lines of a group
        in_frames = False
        if line.startswith(_CHAIN):
            continue
        # workers.recording writes "Name: message" above the traceback, which ends with the same line
        # (with the class's module): keep one.
        if kept and any(line == seen or line.endswith("." + seen) for seen in kept if seen):
            continue
        kept.append(line)
    # Blank lines left between the kept lines collapse to one.
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept))


def _without_paths(text: str) -> str:
    for directory in _server_directories():
        text = text.replace(directory + os.sep, "")
    return text


@cache
def _server_directories() -> tuple[str, ...]:
    """The checkout, the virtualenv and the standard library, as written and as resolved, longest first."""
    found = set()
    for directory in (str(settings.BASE_DIR), sys.prefix, sysconfig.get_paths()["stdlib"]):
        for path in (directory, os.path.realpath(directory)):
            if len(path) > 1:
                found.add(path.rstrip(os.sep))
    return tuple(sorted(found, key=len, reverse=True))
