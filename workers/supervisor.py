"""`manage.py up`: the web server, one worker, the reaper and the webhook delivery loop as child processes, stopped together."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

logger = logging.getLogger(__name__)

MANAGE = str(Path(__file__).resolve().parent.parent / "manage.py")


class DevStack:
    def __init__(self, *, addr: str, worker_args: list[str] | None = None):
        self.addr = addr
        self.worker_args = worker_args or []
        self.children: list[tuple[str, subprocess.Popen]] = []

    def start(self) -> None:
        env = os.environ.copy()  # carries DATABASE_URL to every child
        commands = {
            "web": [sys.executable, MANAGE, "serve", self.addr],
            "worker": [sys.executable, MANAGE, "runworker", *self.worker_args],
            "reaper": [sys.executable, MANAGE, "reap"],
            "webhooks": [sys.executable, MANAGE, "deliverwebhooks"],
        }
        for name, argv in commands.items():
            self.children.append((name, subprocess.Popen(argv, env=env)))

    def wait(self) -> int:
        """Until Ctrl-C/SIGTERM or a child dies; then stop them all."""
        stop = False

        def on_signal(signum, frame):
            nonlocal stop
            stop = True

        signal.signal(signal.SIGINT, on_signal)
        signal.signal(signal.SIGTERM, on_signal)
        code = 0
        while not stop:
            for name, proc in self.children:
                if proc.poll() is not None:
                    logger.error("%s exited with %s; stopping the others", name, proc.returncode)
                    code = proc.returncode or 1
                    stop = True
            time.sleep(0.2)
        self.stop()
        return code

    def stop(self, timeout: float = 30.0) -> None:
        for _, proc in self.children:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for name, proc in self.children:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop in time; killing it", name)
                proc.kill()
