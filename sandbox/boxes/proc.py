"""Process and socket helpers for the host side of a box."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

LOG_CAP = 16 << 20  # bytes a box's log file may grow to; the rest is dropped


@dataclasses.dataclass
class Relay:
    fd: int  # the write end, for the box
    thread: threading.Thread


def relay_log(path: Path, cap: int = LOG_CAP) -> Relay:
    """A pipe whose write end goes to a box; a thread appends what comes to `path` until the
    last writer is gone, up to `cap` bytes (then one line says so, and the rest is dropped)."""
    read_fd, write_fd = os.pipe()

    def copy() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as src, open(path, "ab") as dst:
            capped = False
            while data := src.read(1 << 16):
                room = cap - dst.tell()
                if room > 0:
                    dst.write(data[:room])
                    dst.flush()
                elif not capped:
                    capped = True
                    dst.write(f"\n[log capped at {cap} bytes; the rest dropped]\n".encode())
                    dst.flush()

    thread = threading.Thread(target=copy, name=f"log {path.parent.parent.name}/{path.name}",
                              daemon=True)
    thread.start()
    return Relay(write_fd, thread)


def read_line(stream: IO[bytes], deadline: float) -> str:
    ready, _, _ = select.select([stream], [], [], max(0.0, deadline - time.monotonic()))
    return stream.readline().decode(errors="replace").strip() if ready else ""


@contextlib.contextmanager
def notify_socket(path: Path) -> Iterator[socket.socket]:
    """A datagram socket bound at `path` (through /proc/self/fd: sun_path holds 108 bytes)."""
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dirfd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        sock.bind(f"/proc/self/fd/{dirfd}/{path.name}")
        yield sock
    finally:
        os.close(dirfd)
        sock.close()
        path.unlink(missing_ok=True)


SSHD_EXITED = b"SANDBOX_SSHD_EXITED="  # the box's init, on the same socket: sshd is gone


def notified(sock: socket.socket, timeout: float) -> bytes:
    """The sd_notify message that arrives on `sock` within `timeout` seconds, or b"": sshd's
    `READY=1` once it listens, or the init's `SSHD_EXITED` when sshd exited."""
    return sock.recv(256) if select.select([sock], [], [], timeout)[0] else b""


def listening(table: str, port: int) -> bool:
    """Whether a /proc/net/tcp table has a socket listening (state 0A) on `port`."""
    suffix = f":{port:04X}"
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[1].endswith(suffix) and fields[3] == "0A":
            return True
    return False


def only_child(pid: int) -> int | None:
    """The one child of `unshare` (the box's PID 1), None before it forks."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None


def oldest_child(pid: int, name: str) -> int | None:
    """The child of `pid` named `name` (its comm) that started first, None if there is none."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return None
    found = []
    for child in map(int, children):
        try:
            if Path(f"/proc/{child}/comm").read_text().strip() == name:
                found.append((start_time(child), child))
        except OSError:
            continue  # gone meanwhile
    return min(found)[1] if found else None


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []  # gone meanwhile


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, as far as /proc shows them now."""
    found, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        found += kids
        todo += kids
    return found


def comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def start_time(pid: int) -> int:
    """Field 22 of /proc/<pid>/stat: tells a reused pid from the process we started."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return "".join(f"  {path.name}: {line}\n" for line in text)

