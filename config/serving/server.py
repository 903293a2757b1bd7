"""The production web server: uvicorn serving ``config.asgi``, so that event streams are served live.

One process runs one event loop: a request that waits on the database
waits in a thread (``config.asgi`` hands every request but an event stream
to Django's WSGI handler in a thread pool), and an event stream waits on
the process's hub, holding no database connection.
A stream does keep an idle thread: Django gives every ASGI request its own
executor thread for the sync parts (middleware, signal handlers), which
lives as long as the request does (bench/streams.py: 500 streams, 511
threads, about 72 KB each). On SIGTERM the server stops accepting, ends every open stream
at once (each client reconnects with its ``Last-Event-ID`` to a server that
is up, losing nothing), and lets other requests finish for
``graceful_seconds``.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading

import uvicorn

from config.serving import process as server_process
from config.serving.web import Server, stopped

logger = logging.getLogger(__name__)


def serve(
    *,
    host: str,
    port: int,
    workers: int = 1,
    graceful_seconds: float = 10.0,
    forwarded_allow_ips: str | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop gracefully and return (the process exits 0)."""
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
        log_config=None,  # uvicorn's lines go through the project's logging (config.logging): JSON in production
    )
    # uvicorn re-raises the signal it stopped on once it has shut down, to
    # whatever handler was there before it: a no-op one makes a graceful stop
    # exit 0 rather than 143, which is what systemd and supervisors expect.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopped)
    if workers > 1:
        Supervisor(config, workers=workers).run()
    else:
        Server(config).run()


class Supervisor:
    """``workers`` processes of ``Server`` sharing one listening socket; a process that dies is replaced.

    Ours rather than uvicorn's ``Multiprocess``, which builds plain uvicorn
    servers: each process here ends its event streams on SIGTERM and
    publishes its metrics. SIGTERM or SIGINT stops every process gracefully,
    then returns.
    """

    def __init__(self, config: uvicorn.Config, *, workers: int):
        self.config = config
        self.workers = workers
        self.sockets = [config.bind_socket()]
        self.stopping = threading.Event()
        self.context = multiprocessing.get_context("spawn")
        self.processes: list[multiprocessing.process.BaseProcess] = []

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        self.processes = [self._start() for _ in range(self.workers)]
        while not self.stopping.wait(0.5):
            for index, process in enumerate(self.processes):
                if not process.is_alive():
                    logger.warning(
                        "web process %s exited with %s; starting another",
                        process.pid,
                        process.exitcode,
                    )
                    self.processes[index] = self._start()
        for process in self.processes:
            if process.is_alive():
                process.terminate()  # SIGTERM: a graceful stop
        for process in self.processes:
            process.join()
        for sock in self.sockets:
            sock.close()

    def _start(self) -> multiprocessing.process.BaseProcess:
        process = self.context.Process(
            target=server_process.run, args=(self.config, self.sockets), daemon=False
        )
        process.start()
        return process
