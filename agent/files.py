"""File helpers: atomic replacement, JSON reads that tolerate absence, digests."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

try:  # the built-in implementation: hashlib would map OpenSSL (+3.6 MiB RSS) into the agent
    from _sha256 import sha256 as _sha256
except ImportError:  # Python >= 3.12 names it _sha2
    try:
        from _sha2 import sha256 as _sha256  # type: ignore[no-redef]
    except ImportError:
        from hashlib import sha256 as _sha256  # type: ignore[no-redef,assignment]


def atomic_write(path: Path, data: str | bytes, mode: int = 0o644, durable: bool = False) -> None:
    """Replace path with data so that readers see either the old or the new file, never half.

    `durable` adds an fsync of the file and its folder, for what the agent acts on only once it
    is recorded (the state: a switch, a running task). The status, pidfiles and heartbeat skip
    it: they are rewritten every tick or rebuilt after a crash.
    A failure (a full disk) raises OSError and leaves the old file in place.
    """
    raw = data.encode() if isinstance(data, str) else data
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_json(path: Path, value: Any, mode: int = 0o644, durable: bool = False) -> None:
    # compact: json's C encoder only runs without indent (status.json is written every tick)
    text = json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n"
    atomic_write(path, text, mode, durable)


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is absent, unreadable or not JSON."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def touch(path: Path) -> None:
    """Set the file's mtime to now (creating it if needed): the heartbeat."""
    try:
        os.utime(path)
    except FileNotFoundError:
        atomic_write(path, "")


def append_line(path: Path, line: str) -> None:
    """Append one line with a single O_APPEND write (whole lines, even with other writers)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, (line.rstrip("\n") + "\n").encode())
    finally:
        os.close(fd)


def sha256_file(path: Path) -> str:
    digest = _sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class DigestCache:
    """sha256 of files, recomputed only when (size, mtime, inode) changes.

    The pointer is checked every tick and a node binary may be hundreds of MiB.
    """

    def __init__(self) -> None:
        self._known: dict[str, tuple[tuple[int, int, int], str]] = {}

    def sha256(self, path: Path) -> str:
        st = path.stat()
        key = (st.st_size, st.st_mtime_ns, st.st_ino)
        hit = self._known.get(str(path))
        if hit and hit[0] == key:
            return hit[1]
        value = sha256_file(path)
        self._known[str(path)] = (key, value)
        return value
