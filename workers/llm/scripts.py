"""Scripts of the scripted model for the built-in kinds (and the helpers demo apps write theirs with): what a model would do, done deterministically.

Each script reads the conversation (Chat Completions messages) and returns
the next turn as ``{"content": ..., "tool_calls": [{"name", "arguments"}]}``.
They drive the same loop and the same tools as a real model, so the
built-in kinds work offline (``make run`` without ``LLM_BASE_URL``).
"""

from __future__ import annotations

import json
import re

from workers.llm.corpus import Document, best_sentence, terms

RESEARCH_USER = "Question: {question}\nMaximum sources: {max_sources}"


def last_turn(messages: list[dict]) -> tuple[list[str], list[dict]]:
    """Tool names the last assistant turn called, and the tool results that followed it."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.get("role") == "assistant":
            names = [c["function"]["name"] for c in message.get("tool_calls") or []]
            results = [m for m in messages[index + 1 :] if m.get("role") == "tool"]
            return names, results
    return [], []


def json_or_none(content: str | None):
    try:
        return json.loads(content or "")
    except ValueError:
        return None


def user_field(messages: list[dict], name: str) -> str:
    first = next((m.get("content") or "" for m in messages if m.get("role") == "user"), "")
    found = re.search(rf"^{name}:\s*(.+)$", first, re.MULTILINE)
    return found.group(1).strip() if found else ""


def research_script(messages: list[dict], tools: list[dict]) -> dict:
    """Plan, search the corpus twice, read the best documents, answer with [doc-id] citations."""
    question = user_field(messages, "Question")
    limit = int(re.sub(r"\D", "", user_field(messages, "Maximum sources")) or 3)
    called, results = last_turn(messages)
    if not called:
        keywords = " ".join(dict.fromkeys(terms(question)))
        plan = (
            f"Plan: (1) search the corpus for the question; (2) search again for its key terms "
            f"({keywords}); (3) read the {limit} most relevant documents; (4) answer, citing each document."
        )
        return {
            "content": plan,
            "tool_calls": [
                {"name": "search_docs", "arguments": {"query": question, "limit": 5}},
                {"name": "search_docs", "arguments": {"query": keywords or question, "limit": 5}},
            ],
        }
    if "search_docs" in called:
        best: dict[str, float] = {}
        for result in results:
            for hit in json_or_none(result.get("content")) or []:
                if isinstance(hit, dict) and "doc_id" in hit:
                    best[hit["doc_id"]] = max(
                        best.get(hit["doc_id"], 0.0), float(hit.get("score", 0))
                    )
        ranked = sorted(best, key=lambda doc_id: (-best[doc_id], doc_id))
        # Documents far behind the best match are noise, not sources.
        chosen = [doc_id for doc_id in ranked[:limit] if best[doc_id] >= 0.5 * best[ranked[0]]]
        if not chosen:
            return {"content": f"The corpus has no document about: {question}"}
        return {
            "content": f"Reading {len(chosen)} documents.",
            "tool_calls": [
                {"name": "read_doc", "arguments": {"doc_id": doc_id}} for doc_id in chosen
            ],
        }
    if "read_doc" in called:
        points = []
        for result in results:
            doc = json_or_none(result.get("content"))
            if isinstance(doc, dict) and "text" in doc:
                sentence = best_sentence(
                    Document(doc["doc_id"], doc["title"], doc["text"]), question
                )
                points.append(f"- {sentence} [{doc['doc_id']}]")
        if not points:
            return {"content": f"I could not read any document about: {question}"}
        return {"content": f"{question}\n\n" + "\n".join(points)}
    return {"content": "I have nothing more to add."}
