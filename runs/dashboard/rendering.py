"""What agents wrote, shown as people read it: Markdown answers with linked citations, proposals as
before/after tables (model calls as transcripts: ``runs.dashboard.transcripts``).

Plain functions of stored JSON (a step's input and output, a run's result),
so templates only print and tests can call them. ``runs`` never imports
``workers``: a proposal is read back with its own type (``runs.proposals``),
the other shapes the engine and the built-in kinds store are read as data,
and anything else falls back to JSON. ``markdown_html`` is the one
place that marks text safe, after nh3 has sanitised it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from uuid import UUID

import nh3
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token

from runs.proposals import UNKNOWN, Change, Proposal

# Longer texts are cut for display; the API serves them whole.
MAX_MARKDOWN_CHARS = 50_000
MAX_ENTRY_CHARS = 6_000

# Markdown -----------------------------------------------------------------

# Raw HTML in the text stays text (html off); images would load from anywhere, so ![x](url) stays a link.
_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable(
    ["table", "strikethrough"]
)
_markdown.disable("image")

ALLOWED_TAGS = frozenset(
    {
        "p",
        "br",
        "hr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "strong",
        "em",
        "del",
        "s",
        "code",
        "pre",
        "blockquote",
        "ul",
        "ol",
        "li",
        "a",
        "table",
        "thead",
        "tbody",
        "tr",
        "th",
        "td",
    }
)
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "ol": {"start"}}
# A table column's alignment, as a class of static/css/render.css: the Content-Security-Policy refuses style attributes.
ALIGNMENTS = frozenset({"align-left", "align-center", "align-right"})
_ALIGNMENT = re.compile(r"text-align:\s*(left|center|right)")
LINK_REL = "nofollow noopener noreferrer"

# [doc-id], or several at once: [doc-a, doc-b] / [doc-a; doc-b].
_CITATION = re.compile(r"\[([A-Za-z0-9][\w.-]{0,99}(?:\s*[,;]\s*[A-Za-z0-9][\w.-]{0,99})*)\]")
_CITATION_SEPARATOR = re.compile(r"(\s*[,;]\s*)")


@dataclass(frozen=True)
class Source:
    """A document an answer cites, and where the page shows it (the step that read it, or the Sources list)."""

    doc_id: str
    title: str = ""
    seq: int | None = None  # the step that read it

    @property
    def anchor(self) -> str:
        return "source-" + (slugify(self.doc_id) or "document")

    @property
    def href(self) -> str:
        return f"#step-{self.seq}" if self.seq is not None else f"#{self.anchor}"


def markdown_html(text: Any, sources: Mapping[str, Source] | None = None) -> SafeString:
    """``text`` as sanitised HTML: Markdown rendered, then cleaned by nh3 to an allow-list.

    Raw HTML, scripts and event handlers come out as inert text; links keep
    only http, https, mailto and in-page ``#`` targets and get
    ``rel="nofollow noopener noreferrer"``. A citation ``[doc-id]`` of a
    document in ``sources`` links to it, titled with its title; unknown ids
    stay plain text.
    """
    text = "" if text is None else str(text)
    if len(text) > MAX_MARKDOWN_CHARS:
        text = (
            text[:MAX_MARKDOWN_CHARS]
            + f"\n\n… ({len(text) - MAX_MARKDOWN_CHARS:,} more characters)"
        )
    rendered = _markdown.render(text, {"sources": dict(sources or {})})
    cleaned = nh3.clean(
        rendered,
        tags=set(ALLOWED_TAGS),
        attributes={tag: set(names) for tag, names in ALLOWED_ATTRIBUTES.items()},
        url_schemes={"http", "https", "mailto"},
        url_relative=lambda url: url if url.startswith("#") else None,
        link_rel=LINK_REL,
        allowed_classes={"a": {"citation"}, "th": set(ALIGNMENTS), "td": set(ALIGNMENTS)},
        clean_content_tags={"script", "style"},
    )
    return mark_safe(cleaned)  # sanitised by nh3 just above: the one mark_safe of the dashboard


def _link_citations(state: StateCore) -> None:
    """Turn ``[doc-id]`` in text (not in code or links) into links to the sources in ``env["sources"]``."""
    sources: dict[str, Source] = state.env.get("sources") or {}
    if not sources:
        return
    for block in state.tokens:
        if block.type != "inline" or not block.children:
            continue
        children: list[Token] = []
        in_link = 0
        for token in block.children:
            in_link += {"link_open": 1, "link_close": -1}.get(token.type, 0)
            if token.type == "text" and not in_link and "[" in token.content:
                children.extend(_cited(token.content, sources))
            else:
                children.append(token)
        block.children = children


def _cited(text: str, sources: dict[str, Source]) -> list[Token]:
    tokens: list[Token] = []
    plain = 0

    def add_text(content: str) -> None:
        if content:
            token = Token("text", "", 0)
            token.content = content
            tokens.append(token)

    for found in _CITATION.finditer(text):
        parts = _CITATION_SEPARATOR.split(found.group(1))
        if not any(part in sources for part in parts[::2]):
            continue
        add_text(text[plain : found.start()] + "[")
        for index, part in enumerate(parts):
            source = sources.get(part) if index % 2 == 0 else None
            if source is None:
                add_text(part)
                continue
            opening = Token("link_open", "a", 1)
            opening.attrSet("href", source.href)
            opening.attrSet("class", "citation")
            if source.title:
                opening.attrSet("title", source.title)
            tokens.append(opening)
            add_text(part)
            tokens.append(Token("link_close", "a", -1))
        add_text("]")
        plain = found.end()
    add_text(text[plain:])
    return tokens


def _alignment_classes(state: StateCore) -> None:
    """markdown-it's ``style="text-align:..."`` on table cells as an ``align-*`` class."""
    for token in state.tokens:
        if token.type in ("th_open", "td_open") and token.attrs.get("style"):
            found = _ALIGNMENT.search(str(token.attrs.pop("style")))
            if found:
                token.attrSet("class", f"align-{found[1]}")


_markdown.core.ruler.push("link_citations", _link_citations)
_markdown.core.ruler.push("alignment_classes", _alignment_classes)


# Values as text -------------------------------------------------------------


def as_text(value: Any) -> str:
    """A JSON value as a person reads it: strings as they are, empty as "—", anything else as JSON."""
    if value is None or value == "":
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float | Decimal):
        return str(value)
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _label(key: Any) -> str:
    words = str(key).replace("_", " ").strip()
    return words[:1].upper() + words[1:] if words else "—"


def cut(text: str, limit: int = MAX_ENTRY_CHARS) -> str:
    return (
        text if len(text) <= limit else f"{text[:limit]}\n… ({len(text) - limit:,} more characters)"
    )


def readable(content: Any) -> str:
    """Tool output as text: JSON indented, anything else as it is."""
    if isinstance(content, str):
        try:
            parsed = json.loads(content)
        except ValueError:
            return cut(content)
        if isinstance(parsed, dict | list):
            return cut(json.dumps(parsed, indent=2, ensure_ascii=False))
        return cut(content)
    return cut(as_text(content))


# Proposals ------------------------------------------------------------------


@dataclass(frozen=True)
class ChangeRow:
    field: str
    after: str
    before: str = ""
    before_known: bool = False
    long: bool = False  # several lines or JSON: shown preformatted


@dataclass(frozen=True)
class ProposalView:
    """An approval's proposal as a sentence, what it applies to, a before/after table and details."""

    summary: str = ""
    target: str = ""
    rows: list[ChangeRow] = field(default_factory=list)
    note: str = ""  # the model's words when it made the call
    details: list[ChangeRow] = field(default_factory=list)
    json_text: str = ""  # set when the proposal has no readable shape: shown as JSON

    @property
    def has_before(self) -> bool:
        return any(row.before_known for row in self.rows)


def proposal_view(proposal: Any) -> ProposalView:
    """What the approval card shows for a stored proposal, whatever its shape.

    A ``Proposal``'s JSON (``runs.proposals``: read back with
    ``Proposal.from_json``) shows its summary, its target and a before/after
    table of its changes, the model's note apart from its other details; an
    older tool-call proposal (``{"tool", "arguments", "note"}``) shows the
    arguments; any other dict shows its keys as rows; a string is the
    summary; anything else stays JSON.
    """
    try:
        parsed = Proposal.from_json(proposal)
    except ValueError:
        parsed = None
    if parsed is not None:
        details = {key: value for key, value in parsed.details.items() if key != "note"}
        return ProposalView(
            summary=parsed.summary,
            target=parsed.target,
            rows=[_change_row(change) for change in parsed.changes],
            note=_note(parsed.details),
            details=[_value_row(key, value) for key, value in details.items()],
        )
    if (
        isinstance(proposal, dict)
        and isinstance(proposal.get("tool"), str)
        and isinstance(proposal.get("arguments"), dict)
    ):
        return ProposalView(
            summary=f"Call {proposal['tool']}",
            rows=[_value_row(k, v) for k, v in proposal["arguments"].items()],
            note=_note(proposal),
        )
    if isinstance(proposal, dict) and proposal:
        return ProposalView(rows=[_value_row(k, v) for k, v in proposal.items()])
    if isinstance(proposal, str) and proposal.strip():
        return ProposalView(summary=proposal)
    return ProposalView(json_text=json.dumps(proposal, indent=2, ensure_ascii=False, default=str))


def _note(proposal: dict) -> str:
    note = proposal.get("note")
    return note if isinstance(note, str) else ""


def _value_row(key: Any, value: Any) -> ChangeRow:
    text = as_text(value)
    return ChangeRow(
        field=_label(key), after=text, long=not isinstance(value, str) and "\n" in text
    )


def _change_row(change: Change) -> ChangeRow:
    known = change.before is not UNKNOWN
    after_text, before_text = as_text(change.after), as_text(change.before) if known else ""
    return ChangeRow(
        field=_label(change.field),
        after=after_text,
        before=before_text,
        before_known=known,
        long=any(
            not isinstance(value, str) and "\n" in text
            for value, text in ((change.after, after_text), (change.before, before_text))
        ),
    )


# Results that hold an answer ---------------------------------------------------


@dataclass(frozen=True)
class Section:
    heading: str
    html: SafeString
    run_url: str = ""  # the child run that answered it


@dataclass(frozen=True)
class AnswerView:
    """A run's result that holds prose: an ``answer``, a research ``brief`` or a report of ``sections``."""

    kind: str  # answer | brief | report
    title: str = ""
    html: SafeString = field(default_factory=lambda: SafeString(""))
    sections: list[Section] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    lists: list[tuple[str, list[str]]] = field(default_factory=list)  # (label, items)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (label, text)


def answer_view(result: Any, steps: Iterable[Any] = ()) -> AnswerView | None:
    """What the run page shows of a result holding prose, or None for a result that is only data.

    ``{"answer", "question"?, "citations"?: [{"doc_id", "title"}], "plan"?}``
    (the ``research`` kind) shows the answer as Markdown whose citations link
    to the steps of ``steps`` that read the documents; ``{"brief", "topic",
    "questions", "sources", "review"}`` (``research_brief``) shows the brief;
    ``{"summary", "sections": [{"question", "answer", "run_id"}], "sources"}``
    (``research_many``) one section per question; sections that are not
    objects (a list of strings) are data, shown as JSON.
    """
    if not isinstance(result, dict):
        return None
    if isinstance(result.get("answer"), str):
        known = {
            s.doc_id: s for s in _sources(result.get("citations"), read=_documents_read(steps))
        }
        notes = (
            [("The agent's plan", result["plan"])]
            if isinstance(result.get("plan"), str) and result["plan"]
            else []
        )
        return AnswerView(
            "answer",
            title=as_text(result.get("question")) if result.get("question") else "",
            html=markdown_html(result["answer"], known),
            sources=_cited_in(result["answer"], known),
            notes=notes,
        )
    if isinstance(result.get("brief"), str):
        lists = [
            (label, [as_text(item) for item in result[key]])
            for key, label in (("questions", "Questions"), ("sources", "Sources searched"))
            if isinstance(result.get(key), list) and result[key]
        ]
        notes = (
            [("Review", result["review"])]
            if isinstance(result.get("review"), str) and result["review"]
            else []
        )
        return AnswerView(
            "brief",
            title=as_text(result.get("topic") or ""),
            html=markdown_html(result["brief"]),
            lists=lists,
            notes=notes,
        )
    if isinstance(result.get("sections"), list) and any(
        isinstance(s, dict) for s in result["sections"]
    ):
        sources = _sources(result.get("sources"))
        by_id = {s.doc_id: s for s in sources}
        sections = [
            Section(
                heading=as_text(s.get("question") or ""),
                html=markdown_html(s.get("answer") or "", by_id),
                run_url=_run_url(s.get("run_id")),
            )
            for s in result["sections"]
            if isinstance(s, dict)
        ]
        unanswered = [
            f"{as_text(u.get('question'))} ({as_text(u.get('status'))})"
            for u in result.get("unanswered") or []
            if isinstance(u, dict)
        ]
        return AnswerView(
            "report",
            title=as_text(result.get("summary") or ""),
            sections=sections,
            sources=sources,
            lists=[("Not answered", unanswered)] if unanswered else [],
        )
    return None


def _documents_read(steps: Iterable[Any]) -> dict[str, tuple[int, str]]:
    """doc_id → (seq, title) of the first done tool step whose output is a document (``read_doc``)."""
    read: dict[str, tuple[int, str]] = {}
    for step in (getattr(s, "step", s) for s in steps):
        if step.kind != "tool" or step.status != "done" or not isinstance(step.output, dict):
            continue
        try:
            document = json.loads(step.output.get("content") or "")
        except (TypeError, ValueError):
            continue
        if isinstance(document, dict) and isinstance(document.get("doc_id"), str):
            read.setdefault(document["doc_id"], (step.seq, as_text(document.get("title") or "")))
    return read


def _sources(cited: Any, read: dict[str, tuple[int, str]] | None = None) -> list[Source]:
    read = read or {}
    sources: dict[str, Source] = {}
    for item in cited if isinstance(cited, list) else []:
        if isinstance(item, dict) and isinstance(item.get("doc_id"), str):
            seq, title = read.get(item["doc_id"], (None, ""))
            sources[item["doc_id"]] = Source(
                item["doc_id"], as_text(item.get("title") or title), seq
            )
    for doc_id, (seq, title) in read.items():
        sources.setdefault(doc_id, Source(doc_id, title, seq))
    return list(sources.values())


def _cited_in(text: str, known: dict[str, Source]) -> list[Source]:
    """The sources of ``known`` that ``text`` cites, in the order it first cites them."""
    cited = (
        part
        for found in _CITATION.finditer(text)
        for part in _CITATION_SEPARATOR.split(found.group(1))[::2]
    )
    return [known[doc_id] for doc_id in dict.fromkeys(cited) if doc_id in known]


def _run_url(run_id: Any) -> str:
    try:
        return reverse("runs:detail", args=[UUID(str(run_id))])
    except ValueError:
        return ""
