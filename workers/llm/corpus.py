"""A small local document corpus and the tools the ``research`` kind searches it with.

The documents are the Markdown files in ``workers/llm/corpus/`` (their first
line is the title, their file name the id). Search is BM25 over title and
text: no network and no index to build, so research runs work offline.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from workers.llm.tools import ToolError, tool

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"

STOPWORDS = frozenset(
    "a an and are as at be been before but by can do does for from has have how i if in into is it its of on "
    "or so than that the their them then there these they this to was we what when where which who why will "
    "with without you your should would could about after does not no any all each other one".split()
)
_WORD = re.compile(r"[a-z0-9]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Document:
    doc_id: str
    title: str
    text: str

    def sentences(self) -> list[str]:
        return [s.strip() for s in _SENTENCE.split(self.text.replace("\n", " ")) if s.strip()]


def terms(text: str) -> list[str]:
    """Lowercase words of ``text`` without stopwords, lightly stemmed (a trailing 's' dropped)."""
    words = [w for w in _WORD.findall(text.lower()) if w not in STOPWORDS and len(w) > 1]
    return [w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in words]


@cache
def documents() -> dict[str, Document]:
    docs = {}
    for path in sorted(CORPUS_DIR.glob("*.md")):
        lines = path.read_text(encoding="utf-8").strip().splitlines()
        title = lines[0].lstrip("# ").strip() if lines else path.stem
        docs[path.stem] = Document(path.stem, title, "\n".join(lines[1:]).strip())
    return docs


@cache
def _index() -> tuple[dict[str, Counter], dict[str, int], float]:
    bags = {
        doc_id: Counter(terms(f"{d.title} {d.title} {d.text}")) for doc_id, d in documents().items()
    }
    frequency: Counter = Counter()
    for bag in bags.values():
        frequency.update(set(bag))
    average = sum(sum(b.values()) for b in bags.values()) / max(len(bags), 1)
    return bags, dict(frequency), average


def search(query: str, limit: int = 5) -> list[dict]:
    """The documents that best match ``query`` (BM25), best first, each with its best sentence."""
    bags, frequency, average = _index()
    wanted = set(terms(query))
    n = len(bags)
    scored = []
    for doc_id, bag in bags.items():
        length = sum(bag.values())
        score = 0.0
        for term in wanted:
            tf = bag.get(term, 0)
            if tf:
                idf = math.log(1 + (n - frequency[term] + 0.5) / (frequency[term] + 0.5))
                score += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / average))
        if score > 0:
            scored.append((round(score, 3), doc_id))
    scored.sort(key=lambda item: (-item[0], item[1]))
    docs = documents()
    return [
        {
            "doc_id": doc_id,
            "title": docs[doc_id].title,
            "score": score,
            "snippet": best_sentence(docs[doc_id], query),
        }
        for score, doc_id in scored[:limit]
    ]


def best_sentence(doc: Document, query: str) -> str:
    """The sentence of ``doc`` sharing the most terms with ``query`` (the first one on a tie)."""
    wanted = set(terms(query))
    sentences = doc.sentences()
    if not sentences:
        return ""
    return max(sentences, key=lambda s: (len(wanted & set(terms(s))), -sentences.index(s)))


@tool
def search_docs(query: str, limit: int = 5) -> list[dict]:
    """Search the document corpus; returns the best matching documents (id, title, score, best sentence)."""
    if not query.strip():
        raise ToolError("the query is empty")
    return search(query, max(1, min(limit, 10)))


@tool
def read_doc(doc_id: str) -> dict:
    """Read one document of the corpus in full, by the doc_id that search_docs returned."""
    doc = documents().get(doc_id)
    if doc is None:
        raise ToolError(f"there is no document {doc_id!r}; use an id returned by search_docs")
    return {"doc_id": doc.doc_id, "title": doc.title, "text": doc.text}
