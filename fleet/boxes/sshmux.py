"""One SSH connection per box, reused by the fleet's status reads: OpenSSH's control master.

A status read that starts its own connection pays a key exchange and a login each time; the
loop reads every standing box every tick. The first read of a box starts a master connection
(`ControlMaster=auto`) that outlives it by `PERSIST_S`, and later reads run their command over
it with no handshake, and without starting `ssh` either (`muxclient`).

What a fresh connection guaranteed still holds:
- the host key: a master is made by a strict connection against the fleet's pinned
  known_hosts, and its socket's name hashes the pinned key with the endpoint, so a box pinned
  anew never reaches a master made under its old key; a master whose endpoint's key changes or
  leaves known_hosts (a re-pin, a box forgotten or destroyed) is closed (`close_changed`);
- a dead box: the master asks the box every `ALIVE_S` and gives up after `ALIVE_COUNT`
  silent answers, which ends the reads waiting on it; a read's own deadlines still kill its
  client;
- no pile-up: a master nobody uses exits after `PERSIST_S`.

The sockets live in a private folder (0700, this user's): next to known_hosts where the path is
short enough for a Unix socket (108 bytes, with the 17 characters ssh appends while it binds),
else under $XDG_RUNTIME_DIR, else the system's temporary folder. Where none is private, reads
connect afresh as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

PERSIST_S = 300  # an idle master's life: spans a loop tick's interval (60 s by default)
ALIVE_S = 5  # the master's keep-alive: a box silent for ALIVE_S * ALIVE_COUNT is given up
ALIVE_COUNT = 3
CLOSE_S = 5.0  # `ssh -O exit`'s own deadline; a master that does not answer is unlinked

_NAME_LEN = 20  # hex characters of the socket's name
_BIND_SUFFIX = 17  # ssh binds at "<path>.<16 random characters>", then renames
_SOCKET_MAX = 107  # sun_path's 108 bytes, less the terminating NUL
_SAFE = re.compile(r"[A-Za-z0-9/._+-]+")  # a path ssh reads as one word, with no %-token


def folder(known_hosts: str) -> Path | None:
    """The private folder of the masters of the fleet whose known_hosts is `known_hosts`
    (made where missing); None where no candidate is both short enough and private."""
    return next((d for d in _candidates(known_hosts) if _private(d, make=True)), None)


def _candidates(known_hosts: str) -> list[Path]:
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    dirs = [Path(known_hosts).parent / "ssh-mux",
            *([Path(runtime) / "fleet-ssh"] if runtime else []),
            Path(tempfile.gettempdir()) / f"fleet-ssh-{os.geteuid()}"]
    return [d.absolute() for d in dirs
            if len(str(d.absolute())) + 1 + _NAME_LEN + _BIND_SUFFIX <= _SOCKET_MAX
            and _SAFE.fullmatch(str(d.absolute()))]


def _private(d: Path, make: bool) -> bool:
    """True only when `d` is this user's own folder, not a link, and no one else may enter
    it; made (0700) where missing with `make`."""
    if make:
        with contextlib.suppress(OSError):
            d.mkdir(mode=0o700, parents=True)
    try:
        st = os.lstat(d)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            return False
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.chmod(d, 0o700)  # ours: made strict, as sshd's own folders are
        return True
    except OSError:
        return False


def path(known_hosts: str, user: str, host: str, port: int, host_key: str) -> str | None:
    """The socket of the master to `user@host:port` under the pinned `host_key`; None where
    there is no private folder for it (the read then connects afresh)."""
    d = folder(known_hosts)
    return None if d is None else str(d / _name(known_hosts, user, host, port, host_key))


def _name(known_hosts: str, user: str, host: str, port: int, host_key: str) -> str:
    ident = "\0".join((str(Path(known_hosts).absolute()), user, host, str(port), host_key))
    return hashlib.sha256(ident.encode()).hexdigest()[:_NAME_LEN]


def options(socket: str) -> list[str]:
    """`ssh`'s options that run a command over the master at `socket`, made if missing."""
    return ["-o", "ControlMaster=auto", "-o", f"ControlPath={socket}",
            "-o", f"ControlPersist={PERSIST_S}"]


def running(socket: str) -> bool:
    """Whether a master answers at `socket`."""
    if not os.path.exists(socket):
        return False
    try:
        r = subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "check", "fleet-mux"],
                           capture_output=True, timeout=CLOSE_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return False
    return r.returncode == 0


def close(socket: str) -> None:
    """Close the master at `socket`, if any; once this returns no read reaches it (a master
    that does not answer is unlinked, and exits after `PERSIST_S` with no one to serve)."""
    if not os.path.exists(socket):
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "fleet-mux"],
                       capture_output=True, timeout=CLOSE_S, stdin=subprocess.DEVNULL)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(socket)


def close_endpoint(known_hosts: str, host: str | None, port: int | None,
                   host_key: str | None, user: str = "root") -> None:
    """Close the master to a box the fleet no longer trusts under `host_key` (destroyed,
    forgotten, pinned anew)."""
    if host and port and host_key:
        name = _name(known_hosts, user, host, port, host_key)
        for d in _candidates(known_hosts):  # wherever it was made; no folder made for it
            if _private(d, make=False):
                close(str(d / name))


def close_changed(known_hosts: str, old: list[str], new: list[str]) -> None:
    """Close the masters of the known_hosts lines in `old` that `new` no longer has: a box
    forgotten or destroyed, or an endpoint pinned to another key."""
    for line in set(old) - set(new):
        name, _, key = line.partition(" ")
        host, port = name, 22
        if name.startswith("[") and "]:" in name:
            host, _, p = name[1:].partition("]:")
            port = int(p) if p.isdigit() else 0
        close_endpoint(known_hosts, host, port, key.strip())
