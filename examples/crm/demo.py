"""Three demo leads in the demo tenant, so that `make run` has something for ``crm_update`` to work on."""

from __future__ import annotations

from typing import Any

from examples.crm.models import Lead

LEADS = [
    {
        "name": "Ada Byron",
        "company": "Analytical Engines Ltd",
        "email": "ada@engines.example",
        "stage": "contacted",
        "notes": "Intro call went well; wants pricing for 20 seats.",
    },
    {
        "name": "Grace Hopper",
        "company": "Compiler Works",
        "email": "grace@compilers.example",
        "stage": "proposal",
        "notes": "Proposal sent; decision expected this month.",
    },
    {
        "name": "Alan Turing",
        "company": "Bletchley Analytics",
        "email": "alan@bletchley.example",
        "stage": "new",
        "notes": "",
    },
]


def add_demo_leads(sender: Any = None, *, tenant, **kwargs: Any) -> None:
    """The receiver of ``runs.seed.demo_seeded``: the leads once each (a second `up` finds them)."""
    for lead in LEADS:
        Lead.objects.get_or_create(tenant=tenant, email=lead["email"], defaults=lead)
