"""One web process: uvicorn's server, which ends the process's event streams and publishes its metrics.

``config.serving.server`` starts one in this process, or several through its
``Supervisor`` (each spawned one enters through ``config.serving.process``).
"""

from __future__ import annotations

import asyncio
import signal
import socket

import uvicorn

from runs.metrics.publish import Publisher
from runs.streams.hub import close_all


class Server(uvicorn.Server):
    """uvicorn's server, which ends the process's event streams when told to stop."""

    _loop: asyncio.AbstractEventLoop | None = None
    _publisher: Publisher | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        # What this process counts (people's transitions: cancels, approvals) reaches /metrics (runs.metrics).
        self._publisher = Publisher(role="web").start()
        await super().startup(sockets=sockets)

    async def shutdown(self, sockets=None) -> None:
        await super().shutdown(sockets=sockets)
        if self._publisher is not None:
            await asyncio.to_thread(self._publisher.stop)  # a database write: not on the event loop

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(close_all)


def stopped(signum, frame) -> None:
    """The handler uvicorn's re-raised signal reaches once it has stopped: nothing left to do."""


def serve_process(config: uvicorn.Config, sockets: list[socket.socket]) -> None:
    """One web process of ``serve --workers N`` (spawned: a fresh interpreter, its own connections)."""
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopped)
    config.configure_logging()  # as uvicorn's own spawned processes do (access_log=False among it)
    Server(config).run(sockets=sockets)
