"""Commands on a box over the system's `ssh`, with the fleet's key and pinned host keys.

pyinfra runs the deploys; this is for the operator's own reads that stream (a box's outputs
as a tar stream) or that must not wait for a whole pyinfra run (a job's state).
"""

from __future__ import annotations

import contextlib
import fcntl
import subprocess
from typing import IO, TYPE_CHECKING

from fleet.core.errors import FleetError

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config


def argv(cfg: Config, row: Row, command: str) -> list[str]:
    if not (row.ssh_host and row.ssh_port and row.host_key):
        raise FleetError(f"{row.label}: no pinned SSH endpoint in the registry (is it rented "
                         "and ready? `fleet rent ... --label` resumes a rent)")
    return ["ssh", "-q", "-i", str(cfg.ssh_key), "-p", str(row.ssh_port),
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={cfg.known_hosts}", "-o", "ConnectTimeout=15",
            "-o", "ServerAliveInterval=15",
            # AES-GCM runs on the CPU's AES instructions: outputs stream about 1.5x faster
            # than with OpenSSH's default chacha20 (bench/oneshot.py)
            "-o", "Ciphers=^aes128-gcm@openssh.com", f"root@{row.ssh_host}", command]


def run(cfg: Config, row: Row, command: str,
        timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run `command` on the box; stdout and stderr captured as text."""
    try:
        # a box's shell may print bytes that are not UTF-8 (a motd, a locale): replaced
        return subprocess.run(argv(cfg, row, command), capture_output=True, text=True,
                              errors="replace", timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise FleetError(f"{row.label}: `{command.split()[0]} ...` did not answer within "
                         f"{timeout:.0f}s") from None


def stream(cfg: Config, row: Row, command: str) -> subprocess.Popen[bytes]:
    """Start `command` on the box with its stdout as a byte stream to read."""
    proc = subprocess.Popen(argv(cfg, row, command), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    widen_pipe(proc.stdout.fileno())
    return proc


PIPE_BYTES = 1 << 20


def widen_pipe(fd: int) -> None:
    """Give a pipe 1 MiB instead of 64 KiB where the system allows (Linux, F_SETPIPE_SZ):
    `ssh` and the reader then hand over megabytes per wake-up rather than 64 KiB, which on
    a busy machine is the difference between streaming and ping-pong. Elsewhere a no-op."""
    with contextlib.suppress(OSError, AttributeError):
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)


def stderr_tail(stream: IO[bytes] | None, limit: int = 300) -> str:
    if stream is None:
        return ""
    return stream.read().decode(errors="replace").strip()[-limit:]
