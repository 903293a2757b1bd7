"""``Proposal`` and ``Change`` for agent code, where the rest of the authoring API is.

The type lives in ``runs.proposals``: an approval step stores a proposal's
JSON, and the dashboard, in the web process, reads it back with the same
type. Nothing about a proposal needs the worker, so this module only names
them for ``ctx.approval(name, proposal=Proposal(...))`` and the LLM loop and
framework adapters, which build one for every call of a tool that needs
approval.
"""

from runs.proposals import UNKNOWN, Change, Proposal

__all__ = ["UNKNOWN", "Change", "Proposal"]
