"""The run domain: models, its state machine, services, the API and the dashboard.

``from runs import submit_run`` is the in-process submit path, the one the
API and the dashboard use too (``runs.services.submit_run``). It is looked
up on first use, so that importing this package before Django's app
registry is ready (as INSTALLED_APPS does) stays harmless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runs.services import submit_run

__all__ = ["submit_run"]


def __getattr__(name: str):
    if name == "submit_run":
        from runs.services import submit_run

        return submit_run
    raise AttributeError(f"module 'runs' has no attribute {name!r}")
