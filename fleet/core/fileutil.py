"""Atomic writes and cross-process locks: every file that matters is replaced whole."""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write to a temporary file beside `path`, fsync it, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    # the rename is durable only once the directory entry is
    fsync_dir(path.parent)


def read_small(path: Path, limit: int = 4 << 20) -> str:
    """The text of a small regular file the fleet wrote itself, read without following it
    anywhere it could hang or flood: a FIFO (opened without blocking), a device or a folder is
    an OSError, and so is a file over `limit` bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"{path} is not a regular file")
        if st.st_size > limit:
            raise OSError(f"{path} is {st.st_size} bytes, over {limit}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise OSError(f"{path} grew over {limit} bytes while read")
    return data.decode()


def fsync_dir(folder: Path) -> None:
    """Make the folder's entries (names created, renamed or removed in it) durable."""
    dfd = os.open(folder, os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def fsync_tree(root: Path) -> None:
    """Make every file under `root`, the folders holding them and `root`'s own entry durable."""
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))
    fsync_dir(root.parent)


@contextlib.contextmanager
def locked(path: Path, wait: bool = True) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing) for the block; with
    `wait=False`, BlockingIOError at once when another holds it.

    flock locks die with their holder, so a writer killed mid-update never leaves a stale lock.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield
    finally:
        os.close(fd)
