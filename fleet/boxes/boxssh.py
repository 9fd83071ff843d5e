"""Commands on a box over the system's `ssh`, with the fleet's key and pinned host keys.

pyinfra runs the deploys (in its own process); every read of the operator's goes through
here: the streams (a box's outputs as a tar stream), a job's state, and the facts that
`fleet check` and `fleet publish` read from every box at once (`read_fact`: the fact's own
command and parser, run by `ssh` rather than by an in-process pyinfra).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from pyinfra.api.exceptions import FactProcessError

from fleet.core.errors import FleetError

if TYPE_CHECKING:
    from pyinfra.api.facts import FactBase

    from fleet.core.boxes import Row
    from fleet.core.config import Config


CONNECT_TIMEOUT_S = 15


def argv(cfg: Config, row: Row, command: str) -> list[str]:
    if not (row.ssh_host and row.ssh_port and row.host_key):
        raise FleetError(f"{row.label}: no pinned SSH endpoint in the registry (is it rented "
                         "and ready? `fleet rent ... --label` resumes a rent)")
    return _ssh(str(cfg.ssh_key), str(cfg.known_hosts), "root", row.ssh_host, row.ssh_port,
                command)


def host_argv(data: Mapping[str, Any], command: str) -> list[str]:
    """`ssh` to an inventory host, as its host data says (the pyinfra keys `ssh_hostname`,
    `ssh_port`, `ssh_user`, `ssh_key`, `ssh_known_hosts_file`, ...)."""
    return _ssh(str(data["ssh_key"]), str(data["ssh_known_hosts_file"]),
                str(data.get("ssh_user") or "root"), str(data["ssh_hostname"]),
                int(data.get("ssh_port") or 22), command,
                strict=data.get("ssh_strict_host_key_checking") != "accept-new",
                attempts=1 + int(data.get("ssh_connect_retries") or 0))


def _ssh(key: str, known_hosts: str, user: str, host: str, port: int, command: str, *,
         strict: bool = True, attempts: int = 1) -> list[str]:
    """`ssh` with the fleet's key, checked against the host keys the fleet pinned (`strict`;
    else a box not pinned yet is accepted and its key recorded)."""
    checking = "yes" if strict else "accept-new"
    return ["ssh", "-q", "-i", key, "-p", str(port),
            "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={checking}",
            "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", f"ConnectionAttempts={attempts}",
            "-o", "ServerAliveInterval=15",
            # AES-GCM runs on the CPU's AES instructions: outputs stream about 1.5x faster
            # than with OpenSSH's default chacha20 (bench/oneshot.py)
            "-o", "Ciphers=^aes128-gcm@openssh.com", f"{user}@{host}", command]


@dataclass
class FactRead:
    """One fact read over SSH: `value` when the box answered with one; `late` when SSH
    answered but the command did not finish in time; `error` says why there is no value."""

    value: Any = None
    late: bool = False
    error: str | None = None


_CONNECTED = "fleet-ssh-connected"  # printed first: from here on the command's deadline runs


def read_fact(data: Mapping[str, Any], fact: FactBase[Any], root: str,
              deadline_s: float) -> FactRead:
    """A pyinfra fact (its command and its parser) read from an inventory host through the
    system's `ssh`. Connecting is bounded by ssh's own timeouts; the command, once connected,
    by `deadline_s` (past it ssh is killed and the read is `late`)."""
    asked = fact.command(root=root)
    text = asked if isinstance(asked, str) else asked.get_raw_value()
    command = f"echo {_CONNECTED} && {{ {text}; }}"
    proc = subprocess.Popen(host_argv(data, command), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None and proc.stderr is not None
    out, err = bytearray(), bytearray()
    deadline: float | None = None  # set once the box has answered
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                proc.kill()
                proc.wait()
                return FactRead(late=True, error=f"did not finish within {deadline_s:g} s")
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
            if deadline is None and _CONNECTED.encode() in out:
                deadline = time.monotonic() + deadline_s
    rc = proc.wait()
    said = err.decode(errors="replace").strip()[-300:]
    if rc != 0 or deadline is None:
        return FactRead(error=said or f"ssh exited {rc}")
    answer = out.decode(errors="replace").split(_CONNECTED, 1)[1]
    try:
        return FactRead(fact.process([ln for ln in answer.splitlines() if ln.strip()]))
    except FactProcessError as e:
        return FactRead(error=f"{type(fact).__name__}: {e}")


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
