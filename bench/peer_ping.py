"""The job body of bench/peers.py's dispatch probe, the same for every system measured.

It sends one UDP datagram carrying the job's sequence number to the port the
bench listens on (127.0.0.1). No dependencies: imported by this project's
``bench_ping`` agent and by the peers' task modules alike.
"""

from __future__ import annotations

import socket

HOST = "127.0.0.1"


def send_ping(seq: int, port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.sendto(str(int(seq)).encode(), (HOST, int(port)))
