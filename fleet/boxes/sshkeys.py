"""The fleet's SSH identity and the host keys it pins.

Rented boxes reuse IP:port pairs, so a global known_hosts goes stale and pyinfra refuses a changed
key. The fleet pins each box's key on first contact (read straight off the box's SSH handshake),
keeps it in the registry, and writes a known_hosts file of exactly the live boxes' keys.
"""

from __future__ import annotations

import math
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from fleet.boxes import sshmux
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
    """The ed25519 host key a server proves it holds, read by the system's `ssh`: the key
    exchange checks the server's signature before the key is recorded (in a file of its own,
    trusted for nothing), and no authentication is attempted."""
    wait = max(1, math.ceil(timeout))
    with tempfile.TemporaryDirectory(prefix="fleet-hostkey-") as tmp:
        seen = Path(tmp) / "known_hosts"
        try:
            res = subprocess.run(
                ["ssh", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                 "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={seen}",
                 "-o", "GlobalKnownHostsFile=/dev/null", "-o", "HashKnownHosts=no",
                 "-o", "HostKeyAlgorithms=ssh-ed25519", "-o", "PreferredAuthentications=none",
                 "-o", f"ConnectTimeout={wait}", "-p", str(port), f"fleet@{host}", "true"],
                capture_output=True, text=True, errors="replace", timeout=2 * wait + 5,
                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise FleetError(f"ssh {host}:{port}: no host key within {2 * wait + 5} s") from None
        lines = seen.read_text().splitlines() if seen.exists() else []
    for line in lines:
        parts = line.split()
        if len(parts) >= 3 and parts[-2] == "ssh-ed25519":
            return f"{parts[-2]} {parts[-1]}"
    said = (res.stderr.strip().splitlines() or [f"ssh exited {res.returncode}"])[-1]
    raise FleetError(f"ssh {host}:{port}: no host key: {said}")


def known_hosts_line(host: str, port: int, key: str) -> str:
    name = host if port == 22 else f"[{host}]:{port}"
    return f"{name} {key}"


def write_known_hosts(path: Path, rows: Iterable[Row]) -> None:
    """Write the live boxes' pinned keys, and close the master connection (`sshmux`) of every
    box whose line goes or changes: a master made under a key the fleet no longer pins never
    carries a read on."""
    lines = sorted(
        known_hosts_line(r.ssh_host, r.ssh_port, r.host_key)
        for r in rows
        if r.live and r.ssh_host and r.ssh_port and r.host_key
    )
    try:
        old = path.read_text().splitlines()
    except FileNotFoundError:
        old = []
    write_atomic(path, "".join(line + "\n" for line in lines), mode=0o600)
    sshmux.close_changed(str(path), old, lines)
