"""The production web server: uvicorn serving ``config.asgi``, so that event streams are served live.

One process runs one event loop: a request that waits on the database
waits in a thread (Django runs sync views and middleware there), and an
event stream waits on the process's hub, holding no database connection.
It does keep an idle thread: Django gives every ASGI request its own
executor thread for the sync parts (middleware, signal handlers), which
lives as long as the request does (bench/streams.py: 500 streams, 511
threads, about 72 KB each). On SIGTERM the server stops accepting, ends every open stream
at once (each client reconnects with its ``Last-Event-ID`` to a server that
is up, losing nothing), and lets other requests finish for
``graceful_seconds``.
"""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.supervisors import Multiprocess

from runs.streams.hub import close_all


class Server(uvicorn.Server):
    """uvicorn's server, which ends the process's event streams when told to stop."""

    _loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(close_all)


def serve(*, host: str, port: int, workers: int = 1, graceful_seconds: float = 10.0,
          forwarded_allow_ips: str | None = None) -> None:
    config = uvicorn.Config(
        "config.asgi:application",
        host=host,
        port=port,
        workers=workers,
        lifespan="off",  # Django has no lifespan handler
        timeout_graceful_shutdown=int(graceful_seconds),
        proxy_headers=forwarded_allow_ips is not None,
        forwarded_allow_ips=forwarded_allow_ips,
        server_header=False,
        access_log=False,
    )
    server = Server(config)
    if workers > 1:
        Multiprocess(config, target=server.run, sockets=[config.bind_socket()]).run()
    else:
        server.run()
