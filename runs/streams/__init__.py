"""Live event streams (docs/how-to/streams.md): a run's Events as Server-Sent Events, resumable by seq.

``hub`` is the one listener of a web process: it watches the runs its
streams follow, wakes on their NOTIFY and reads new Events in one query for
all of them; ``views`` serves ``GET /api/runs/{id}/events`` from it;
``tokens`` signs the short-lived tokens a browser's ``EventSource`` sends
instead of a header; ``ephemeral`` carries the updates a step pushes
without an Event row (``ctx.emit``).
"""
