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


SUPPORT_USER = "Customer: {text}"


def support_script(messages: list[dict], tools: list[dict]) -> dict:
    """A support assistant: a credit asked for goes to a person first; a question is looked up in the corpus.

    It reads the customer's message (the last user message) and, like a
    real model, the conversation before it: "as I said" finds what the
    customer said earlier.
    """
    text = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")
    text = text.removeprefix("Customer: ").strip()
    lowered = text.lower()
    called, results = last_turn(messages)
    if not called:
        if re.search(r"\b(credit|refund)\b", lowered):
            amount = int(next(iter(re.findall(r"\d+", text)), "500"))
            return {
                "content": "A credit needs a colleague's approval; asking.",
                "tool_calls": [
                    {
                        "name": "issue_credit",
                        "arguments": {"amount_cents": amount, "reason": text[:200]},
                    }
                ],
            }
        if re.search(r"\b(thanks|thank you|bye|that's all)\b", lowered):
            return {
                "content": "Glad I could help. I'm closing this conversation; write again any time."
            }
        return {
            "content": "Looking this up.",
            "tool_calls": [{"name": "search_docs", "arguments": {"query": text, "limit": 3}}],
        }
    if "issue_credit" in called:
        outcome = json_or_none(results[0].get("content")) if results else None
        if isinstance(outcome, dict) and outcome.get("credited_cents"):
            return {
                "content": f"Done: a credit of {outcome['credited_cents']} cents is on your account "
                f"(reference {outcome['reference']})."
            }
        said = results[0].get("content") if results else ""
        return {"content": f"I could not issue the credit: {said}"}
    if "search_docs" in called:
        hits = json_or_none(results[0].get("content")) if results else None
        if isinstance(hits, list) and hits and isinstance(hits[0], dict):
            best = hits[0]
            return {"content": f"{best.get('snippet') or best.get('title')} [{best['doc_id']}]"}
        return {
            "content": "I found nothing about that in our documentation; a colleague will follow up."
        }
    return {"content": "Is there anything else I can help with?"}
