"""What an approval asks a person to approve: a ``Proposal`` of ``Change``s, stored as plain JSON.

Pass one to ``ctx.approval(name, proposal=Proposal(...))``; the LLM loop
builds one for every call of a ``needs_approval`` tool (from the tool's
``propose=`` function, or from the call's arguments). The approval step
stores it as ``{"proposal": <Proposal.to_json()>}``, the API returns that JSON
as stored, and the dashboard shows it as a sentence and a before/after table:

    {"summary": "Update lead Ana Lopez (Acme)",       what will happen, one sentence
     "target": "Lead 1 (ana@acme.example)",           what it happens to (may be "")
     "changes": [{"field": "stage", "before": "new", "after": "qualified"}],
     ...details}                                      any other keys, shown as details

A change whose ``before`` is not known leaves the key out. Details sit beside
the three keys rather than under one of their own, so a consumer that reads
``proposal["arguments"]`` of a tool call keeps working.

The type is the domain's: the worker makes the JSON (``ctx.approval``,
re-exported by ``workers``) and the dashboard reads it back with
``Proposal.from_json`` (``runs.dashboard.rendering``), which refuses JSON of
another shape with ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["UNKNOWN", "Change", "Proposal"]

RESERVED_KEYS: Final = frozenset({"summary", "target", "changes"})


class _Unknown:
    """The ``before`` of a change nobody looked up (a tool call's argument, say)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"


UNKNOWN: Final = _Unknown()


@dataclass(frozen=True)
class Change:
    """One value that will change: ``field`` goes from ``before`` to ``after`` (JSON values).

    ``before`` is ``UNKNOWN`` when it was not read (``None`` means "empty").
    """

    field: str
    before: Any
    after: Any

    def to_json(self) -> dict:
        data: dict[str, Any] = {"field": self.field}
        if self.before is not UNKNOWN:
            data["before"] = self.before
        data["after"] = self.after
        return data

    @classmethod
    def from_json(cls, data: Any) -> Change:
        """The Change ``to_json`` gave ``data`` for; ``ValueError`` if ``data`` is not one."""
        if not isinstance(data, dict) or not isinstance(data.get("field"), str):
            raise ValueError(f"not a proposal's change: {data!r:.200}")
        return cls(data["field"], data.get("before", UNKNOWN), data.get("after"))


@dataclass(frozen=True)
class Proposal:
    """What an approval asks a person to approve: what will change, on what, from what to what.

    ``summary`` says what will happen in one sentence ("Update lead Ana
    Lopez (Acme)"); ``target`` names what it happens to; ``changes`` lists
    the values that change with their before and after; ``details`` holds
    anything else worth showing (JSON values; not the keys ``summary``,
    ``target`` or ``changes``).

        ctx.approval("refund", proposal=Proposal(
            "Refund order 1042", target="Order 1042 (ana@example.com)",
            changes=[Change("status", "paid", "refunded"), Change("balance", 120, 0)],
            details={"reason": "damaged in transit"},
        ))
    """

    summary: str
    target: str = ""
    changes: list[Change] = field(default_factory=list)
    details: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.summary, str) or not self.summary.strip():
            raise ValueError("a proposal needs a summary: one sentence saying what will happen")
        if not all(isinstance(change, Change) for change in self.changes):
            raise TypeError("a proposal's changes must be Change(field, before, after) values")
        clashing = RESERVED_KEYS & set(self.details)
        if clashing:
            raise ValueError(f"a proposal's details cannot use the keys {sorted(clashing)}")

    def to_json(self) -> dict:
        """The plain JSON dict an approval step stores (see the module's docstring)."""
        return {
            "summary": self.summary,
            "target": self.target,
            "changes": [change.to_json() for change in self.changes],
            **self.details,
        }

    @classmethod
    def from_json(cls, data: Any) -> Proposal:
        """The Proposal ``to_json`` gave ``data`` for; ``ValueError`` if ``data`` is not a proposal's JSON."""
        if not isinstance(data, dict):
            raise ValueError(f"a proposal is a JSON object, not {type(data).__name__}")
        summary, target, changes = (
            data.get("summary"),
            data.get("target") or "",
            data.get("changes"),
        )
        if not isinstance(summary, str) or not isinstance(target, str):
            raise ValueError("a proposal's summary and target are strings")
        if changes is not None and not isinstance(changes, list):
            raise ValueError("a proposal's changes are a list")
        return cls(
            summary=summary,
            target=target,
            changes=[Change.from_json(change) for change in changes or []],
            details={key: value for key, value in data.items() if key not in RESERVED_KEYS},
        )
