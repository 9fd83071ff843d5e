"""File helpers: atomic replacement, JSON reads that tolerate absence, digests."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import threading
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


MAX_JSON_BYTES = 16 << 20  # a record of the agent's (state, pidfile, status) is far smaller


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is absent, unreadable, not JSON, not a regular file
    (a FIFO would block: it is opened non-blocking) or over MAX_JSON_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON_BYTES:
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return json.loads(f.read(MAX_JSON_BYTES + 1))
    except (OSError, ValueError, RecursionError):  # "[" * 200000 is garbage too
        return None
    finally:
        os.close(fd)


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


MAX_PROGRAM_BYTES = 4 << 30  # a node binary is hundreds of MiB; a larger "release" is refused


def open_regular(path: Path | str, limit: int | None = None) -> tuple[int, os.stat_result]:
    """An fd on path and its fstat, for reading what is there now: OSError for a NUL in the
    path, a special file (O_NONBLOCK: a FIFO cannot hang the open; a symlink is followed and
    its target checked, so /dev/zero is refused) or a file over `limit`."""
    if "\0" in str(path):
        raise OSError(errno.EINVAL, "the path holds a NUL byte", str(path))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if limit is not None and st.st_size > limit:
            raise OSError(errno.EFBIG, f"{st.st_size} bytes, over the {limit} cap", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _hash_fd(fd: int, size: int) -> str:
    digest = _sha256()
    left = size + 1  # never more than fstat said (plus one byte: a file still growing differs)
    while left > 0:
        block = os.read(fd, min(1 << 20, left))
        if not block:
            break
        digest.update(block)
        left -= len(block)
    return digest.hexdigest()


_CHILD = "import os, sys; os.nice(19); from agent.base.files import _hash_fd; " \
         "print(_hash_fd(0, int(sys.argv[1])))"


def _hash_in_child(fd: int, size: int) -> str:
    """_hash_fd's digest of the open fd, computed by a child process at the lowest CPU
    priority. The built-in sha256 holds the GIL while it hashes a block, so a thread hashing
    beside the agent's loop would hold the loop back at each of its system calls; a thread
    that waits for a child holds nothing."""
    os.lseek(fd, 0, os.SEEK_SET)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run([sys.executable, "-c", _CHILD, str(size)], stdin=fd,
                          capture_output=True, env=env, check=False)
    out = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or len(out) != 64:
        why = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [out]
        raise OSError(errno.EIO, f"the hashing process failed ({done.returncode}): {why[0]}")
    return out


def sha256_file(path: Path | str, limit: int | None = None) -> str:
    """sha256 of the regular file at path (OSError otherwise, see open_regular); a program
    file is hashed with limit=MAX_PROGRAM_BYTES."""
    fd, st = open_regular(path, limit)
    try:
        return _hash_fd(fd, st.st_size)
    finally:
        os.close(fd)


def identity(st: os.stat_result) -> tuple[int, ...]:
    """What a digest is cached by: device, inode, size, mtime, ctime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class DigestCache:
    """sha256 of files, recomputed only when the file's identity (device, inode, size, mtime,
    ctime) changes: a release replaced by rename has another inode, one rewritten in place
    another ctime (an mtime can be put back with `touch -d`, a ctime cannot). The identity is
    the fstat of the very fd that is hashed, so a swap between a stat and the read cannot pair
    one file's identity with another's content. Keyed by identity, not path, so
    /proc/<pid>/exe (the very file a process runs) shares the entry of its path. The pointer
    is checked every tick and a node binary may be hundreds of MiB. Shared between the agent's
    loop and its digest worker (agent/daemon/digests.py), hence the lock.
    """

    LIMIT = 64  # entries kept; the oldest go first

    def __init__(self) -> None:
        self._known: dict[tuple[int, ...], str] = {}
        self._lock = threading.Lock()

    def known(self, st: os.stat_result) -> str | None:
        """The cached sha256 of the file with this fstat, or None."""
        with self._lock:
            return self._known.get(identity(st))

    def _remember(self, st: os.stat_result, value: str) -> None:
        with self._lock:
            if len(self._known) >= self.LIMIT:
                del self._known[next(iter(self._known))]
            self._known[identity(st)] = value

    def sha256(self, path: Path | str) -> str:
        return self.digest(path)[0]

    def digest(self, path: Path | str) -> tuple[str, os.stat_result]:
        """(sha256, the fstat it belongs to) of the regular file at path, hashed here and now
        when not cached; OSError otherwise."""
        fd, st = open_regular(path, MAX_PROGRAM_BYTES)
        try:
            value = self.known(st)
            if value is None:
                value = _hash_fd(fd, st.st_size)
                self._remember(st, value)
        finally:
            os.close(fd)
        return value, st

    def hash_unchanged(self, path: Path | str) -> os.stat_result | None:
        """Hash the file at path into the cache, unless it is there already. A file whose
        identity changed while it was hashed is not cached: its fstat after the hash is
        returned instead (None otherwise). OSError as open_regular."""
        fd, st = open_regular(path, MAX_PROGRAM_BYTES)
        try:
            if self.known(st) is not None:
                return None
            value = _hash_in_child(fd, st.st_size)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        if identity(after) != identity(st):
            return after
        self._remember(st, value)
        return None
