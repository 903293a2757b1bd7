"""Code blocks of the documentation that tests run: each follows a mark, ``<!-- <prefix>: <name> -->``."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def marked_blocks(path: Path, prefix: str) -> dict[str, str]:
    """``{name: code}`` of the fenced blocks right after ``<!-- prefix: name -->`` in ``path``."""
    pattern = re.compile(
        rf"^<!-- {re.escape(prefix)}: (?P<name>[^>]+?) -->\n```[\w-]*\n(?P<code>.*?)^```$",
        re.MULTILINE | re.DOTALL,
    )
    blocks: dict[str, str] = {}
    for match in pattern.finditer(path.read_text()):
        name = match["name"]
        assert name not in blocks, f"{path.name}: two blocks marked {name!r}"
        blocks[name] = match["code"]
    return blocks


def relative_links(path: Path) -> list[str]:
    """The targets of the Markdown links in ``path`` that are not URLs or anchors (without #fragment)."""
    text = re.sub(r"^```.*?^```$", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [
        target.split("#", 1)[0]
        for target in targets
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
    ]
