"""Loopback ports for the servers tests start."""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback TCP port free now, below the kernel's ephemeral range: a port from that
    range (what binding port 0 gives) can be taken as an outgoing connection's source port
    between this pick and the server's own bind, which then fails "address already in use"."""
    low = _ephemeral_low()
    for port in random.sample(range(LOWEST, max(low, LOWEST + 1)), k=min(200, low - LOWEST)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {LOWEST}-{low - 1}")
