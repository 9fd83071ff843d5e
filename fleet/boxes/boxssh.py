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
from typing import IO, TYPE_CHECKING, Any, Protocol

from facts.agent_json import Unreadable
from fleet.boxes import muxclient, sshmux
from fleet.core.errors import FleetError

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config


CONNECT_TIMEOUT_S = 15
# the key exchange of a status read: OpenSSH 9's default (sntrup761x25519, post-quantum) costs
# about 80 ms of the operator's CPU per connection, ten times curve25519's, and the loop reads
# every box's status every tick (bench/RESULTS.md); a status carries no secret worth that
STATUS_KEX = "curve25519-sha256,curve25519-sha256@libssh.org"


def argv(cfg: Config, row: Row, command: str) -> list[str]:
    if not (row.ssh_host and row.ssh_port and row.host_key):
        raise FleetError(f"{row.label}: no pinned SSH endpoint in the registry (is it rented "
                         "and ready? `fleet rent ... --label` resumes a rent)")
    return _ssh(str(cfg.ssh_key), str(cfg.known_hosts), "root", row.ssh_host, row.ssh_port,
                command)


def host_argv(data: Mapping[str, Any], command: str, kex: str | None = None,
              reuse: bool = False) -> list[str]:
    """`ssh` to an inventory host, as its host data says (the pyinfra keys `ssh_hostname`,
    `ssh_port`, `ssh_user`, `ssh_key`, `ssh_known_hosts_file`, ...); `kex`: the key exchange
    algorithms, where not OpenSSH's default. `reuse`: over the box's master connection
    (`sshmux`), made if missing, where its host key is pinned (`host_key`)."""
    user, host = str(data.get("ssh_user") or "root"), str(data["ssh_hostname"])
    port = int(data.get("ssh_port") or 22)
    strict = data.get("ssh_strict_host_key_checking") != "accept-new"
    return _ssh(str(data["ssh_key"]), str(data["ssh_known_hosts_file"]), user, host, port,
                command, strict=strict, kex=kex, mux=master(data) if reuse else None)


def master(data: Mapping[str, Any]) -> str | None:
    """The socket of the inventory host's master connection (`sshmux`): only for a box whose
    host key is pinned (`host_key`) and checked strictly; None: connect afresh."""
    if data.get("ssh_strict_host_key_checking") == "accept-new" or not data.get("host_key"):
        return None
    return sshmux.path(str(data["ssh_known_hosts_file"]), str(data.get("ssh_user") or "root"),
                       str(data["ssh_hostname"]), int(data.get("ssh_port") or 22),
                       str(data["host_key"]))


def _ssh(key: str, known_hosts: str, user: str, host: str, port: int, command: str, *,
         strict: bool = True, kex: str | None = None, mux: str | None = None) -> list[str]:
    """`ssh` with the fleet's key, checked against the host keys the fleet pinned (`strict`;
    else a box not pinned yet is accepted and its key recorded). ssh's own errors (a host key
    that differs from the pinned one) reach stderr; its warnings do not. `mux`: the socket of
    the box's master connection, whose keep-alive gives a silent box up sooner."""
    checking = "yes" if strict else "accept-new"
    alive = (f"ServerAliveInterval={sshmux.ALIVE_S}", "-o",
             f"ServerAliveCountMax={sshmux.ALIVE_COUNT}", *sshmux.options(mux)) if mux else \
        ("ServerAliveInterval=15",)
    return ["ssh", "-o", "LogLevel=ERROR", "-i", key, "-p", str(port),
            "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={checking}",
            "-o", f"UserKnownHostsFile={known_hosts}",
            "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", *alive,
            # AES-GCM runs on the CPU's AES instructions: outputs stream about 1.5x faster
            # than with OpenSSH's default chacha20 (bench/oneshot.py)
            "-o", "Ciphers=^aes128-gcm@openssh.com",
            *(("-o", f"KexAlgorithms={kex}") if kex else ()), f"{user}@{host}", command]


class Fact(Protocol):
    """A fact's command and parser: a pyinfra fact (`facts.box`), or one of the same facts
    without pyinfra (`facts.agent_json`: `fleet check`'s status read, which so never loads
    pyinfra)."""

    def command(self, root: str) -> Any: ...  # str, or pyinfra's StringCommand

    def process(self, output: list[str]) -> Any: ...


@dataclass
class FactRead:
    """One fact read over SSH. `answered`: the box ran the command (SSH is up); `value`: what
    the fact made of its output (None when it could not); `late`: the box started the command
    but did not finish it in time, so it is slow, not dead; `error`: why there is no value.
    A box whose sshd connects but never starts the command (a hung login) has not answered:
    nothing can be read from or deployed to it, however long it keeps the connection
    (`connected`: no retry helps it)."""

    value: Any = None
    answered: bool = False
    late: bool = False
    error: str | None = None
    connected: bool = False  # ssh got through to the box, whatever became of the command


_CONNECTED = "fleet-ssh-connected"  # printed first: from here on the command's deadline runs
LOGIN_S = 2 * CONNECT_TIMEOUT_S  # connected to the command's start: login, the shell's own start


def read_fact(data: Mapping[str, Any], fact: Fact, root: str, deadline_s: float) -> FactRead:
    """A fact (its command and its parser) read from an inventory host through the
    system's `ssh`. Connecting is bounded by ssh's own timeout, the login by `LOGIN_S`, the
    command by `deadline_s`. An ssh that fails before the command ran is tried again, as the
    host data's `ssh_connect_retries` says (a reset during the handshake is a flake)."""
    asked = fact.command(root=root)
    text = asked if isinstance(asked, str) else asked.get_raw_value()
    argv = host_argv(data, f"echo {_CONNECTED} && {{ {text}; }}", kex=STATUS_KEX, reuse=True)
    socket = master(data)
    retries = int(data.get("ssh_connect_retries") or 0)
    read = _read_once(argv, fact, deadline_s, socket)
    for attempt in range(retries):
        if read.answered or read.late or read.connected:
            break
        time.sleep(0.5 * (attempt + 1))
        read = _read_once(argv, fact, deadline_s, socket)
    return read


# what ssh prints last when strict checking refuses the key a box presents
KEY_REFUSED_SSH = "Host key verification failed."
KEY_REFUSED = "host key refused: the box presents another host key than the one pinned"


def ssh_words(err: str) -> str:
    """ssh's own words on a failure, short: a refused host key said plainly (its banner runs
    to many lines, the words that matter last), else the tail of what it said."""
    if KEY_REFUSED_SSH in err:
        return KEY_REFUSED
    return err.strip()[-300:]


def _read_once(argv: list[str], fact: Fact, deadline_s: float,
               socket: str | None) -> FactRead:
    window = CONNECT_TIMEOUT_S + LOGIN_S + deadline_s
    start_by = time.monotonic() + window
    proc: subprocess.Popen[bytes] | muxclient.Session | None = None
    if socket is not None and os.path.exists(socket):
        try:  # over the master without starting `ssh` (`muxclient`)
            proc = muxclient.open_session(socket, argv[-1], window)
        except muxclient.NotOpened:
            sshmux.close(socket)  # as a client killed at the deadline would have it
            return FactRead(error=f"connected, but the command did not start within "
                            f"{window:g} s", connected=True)
        except muxclient.MuxError:
            pass  # the system's `ssh`: it makes the master anew, or connects afresh
    if proc is None:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL)
    return _read_answer(proc, fact, deadline_s, socket, start_by, window)


def _read_answer(proc: subprocess.Popen[bytes] | muxclient.Session, fact: Fact,
                 deadline_s: float, socket: str | None, start_by: float,
                 window: float) -> FactRead:
    out, err = bytearray(), bytearray()
    started, finished = _collect(proc, out, err, deadline_s, start_by)
    if not finished:
        proc.kill()
        proc.wait()
        if socket is not None:  # the box's end of the session goes with its connection,
            sshmux.close(socket)  # as a fresh one's did; the next read connects anew
        if not started:  # ssh connected (else it would have exited by now)
            return FactRead(error="connected, but the command did not start within "
                            f"{window:g} s", connected=True)
        return FactRead(answered=True, late=True,
                        error=f"did not finish within {deadline_s:g} s")
    return _answer(proc.wait(), fact, out, err, started)


def _collect(proc: subprocess.Popen[bytes] | muxclient.Session, out: bytearray,
             err: bytearray, deadline_s: float, start_by: float) -> tuple[bool, bool]:
    """Read the command's stdout and stderr into `out` and `err` until both end, or its time
    is up: by `start_by` until the box starts it, then `deadline_s` more. (started, finished)"""
    assert proc.stdout is not None and proc.stderr is not None
    deadline: float | None = None  # set once the box has started the command
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while sel.get_map():
            left = (deadline or start_by) - time.monotonic()
            if left <= 0:
                return deadline is not None, False
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
            if deadline is None and _CONNECTED.encode() in out:
                deadline = time.monotonic() + deadline_s
    return deadline is not None, True


def _answer(rc: int, fact: Fact, out: bytearray, err: bytearray, started: bool) -> FactRead:
    """What a finished command said: the fact's value, or why there is none."""
    said = ssh_words(err.decode(errors="replace"))
    if not started:
        return FactRead(error=said or f"ssh exited {rc}")
    if rc != 0:  # the fact's commands end in `|| true`: the connection broke under it
        return FactRead(answered=True, error=said or f"ssh exited {rc}")
    answer = out.decode(errors="replace").split(_CONNECTED, 1)[1]
    try:
        return FactRead(fact.process([ln for ln in answer.splitlines() if ln.strip()]),
                        answered=True)
    except Unreadable as e:
        return FactRead(answered=True, error=str(e))
    except Exception as e:
        # a pyinfra fact's refusal (only a pyinfra fact raises it, so pyinfra is loaded then)
        from pyinfra.api.exceptions import FactProcessError

        if isinstance(e, FactProcessError):
            return FactRead(answered=True, error=str(e))
        raise


def run(cfg: Config, row: Row, command: str, timeout: float = 120.0,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `command` on the box, `stdin` (text) as its input; stdout and stderr captured."""
    try:
        # a box's shell may print bytes that are not UTF-8 (a motd, a locale): replaced
        return subprocess.run(argv(cfg, row, command), capture_output=True, text=True,
                              errors="replace", timeout=timeout, input=stdin,
                              stdin=subprocess.DEVNULL if stdin is None else None)
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
