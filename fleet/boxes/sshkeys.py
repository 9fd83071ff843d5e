"""The fleet's SSH identity and the host keys it pins.

Rented boxes reuse IP:port pairs, so a global known_hosts goes stale and pyinfra refuses a changed
key. The fleet pins each box's key on first contact (read straight off the box's SSH handshake),
keeps it in the registry, and writes a known_hosts file of exactly the live boxes' keys.
"""

from __future__ import annotations

import math
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.core.errors import FleetError
from fleet.core.fileutil import locked, write_atomic

if TYPE_CHECKING:
    from fleet.core.boxes import Row


def ensure_key(path: Path) -> Path:
    """Create the fleet's ed25519 key pair at `path` (+ .pub) if it does not exist."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with locked(path.with_name(path.name + ".lock")):
            if not path.exists():
                subprocess.run(
                    ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "fleet", "-f", str(path)],
                    check=True, stdin=subprocess.DEVNULL)
    return path


def public_key(path: Path) -> str:
    return Path(str(path) + ".pub").read_text().strip()


def fetch_host_key(host: str, port: int, timeout: float = 10.0) -> str:
    """Read the ed25519 host key a server presents (no authentication needed), with the
    system's `ssh-keyscan`, as every other SSH of the operator's goes through OpenSSH."""
    wait = max(1, math.ceil(timeout))
    try:
        res = subprocess.run(["ssh-keyscan", "-T", str(wait), "-t", "ed25519", "-p", str(port),
                              host], capture_output=True, text=True, errors="replace",
                             timeout=wait + 5, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FleetError(f"ssh {host}:{port}: no host key within {wait} s") from None
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "ssh-ed25519":
            return f"{parts[1]} {parts[2]}"
    said = (res.stderr.strip().splitlines() or ["no answer"])[-1]
    raise FleetError(f"ssh {host}:{port}: no host key: {said}")


def known_hosts_line(host: str, port: int, key: str) -> str:
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key}"


def write_known_hosts(path: Path, rows: Iterable[Row]) -> None:
    lines = sorted(
        known_hosts_line(r.ssh_host, r.ssh_port, r.host_key)
        for r in rows
        if r.live and r.ssh_host and r.ssh_port and r.host_key
    )
    write_atomic(path, "".join(line + "\n" for line in lines), mode=0o600)
