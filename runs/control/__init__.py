"""People acting on live runs: cancel, pause, resume, approve, reject, resolve, message, retry, fork.

Each action is a service used by the API, the dashboard and the admin alike:
it locks the run row, checks the state it expects (raising
``InvalidTransition``, a 409, otherwise), makes one guarded UPDATE and
appends an Event naming who acted (``runs.events``), all in one
transaction, on the database's clock. A run that goes back to the queue is
counted and announced to workers after the commit. A running run is never
changed under its worker: a cancel or pause is a request the worker honours
at its next step boundary (answered 202).
"""

from runs.control.decisions import approve_run, decide_approval, reject_run, resolve_run
from runs.control.fork import fork_run
from runs.control.lifecycle import (
    cancel_children,
    cancel_run,
    cancel_runs,
    pause_run,
    post_message,
    resume_run,
)
from runs.control.retry import retry_run
from runs.control.transition import Outcome

__all__ = [
    "Outcome",
    "approve_run",
    "cancel_children",
    "cancel_run",
    "cancel_runs",
    "decide_approval",
    "fork_run",
    "pause_run",
    "post_message",
    "reject_run",
    "resolve_run",
    "resume_run",
    "retry_run",
]
