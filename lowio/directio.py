"""Bulk bytes to and from disk past the page cache (O_DIRECT), where the filesystem allows.

The archive's copies of a job's outputs and the sandbox store's objects are written once and
read once or twice soon after: caching them only evicts what the machine does use, and every
GiB pushed into the page cache is memory the kernel must find first (on a virtual machine
whose host backs guest memory lazily, finding it costs more CPU than hashing the bytes).
Direct I/O moves the bytes between one reused, page-aligned buffer and the disk instead.
Filesystems without O_DIRECT get ordinary I/O through the same calls.

    DirectWriter(path)               a new file, written in any pieces; close() writes the tail
    DirectReader(path)               a file object for readers that ask for pieces (uploads)
    read_range(path, start, length)  views of a reused buffer over part of a file
"""

from __future__ import annotations

import errno
import fcntl
import io
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
ALIGN = 4096  # covers every logical block size Linux's direct I/O asks for


def _open(path: Path, flags: int) -> tuple[int, bool]:
    """An fd for `path`, direct if the filesystem takes it: (fd, direct)."""
    try:
        return os.open(path, flags | os.O_DIRECT, 0o644), True
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
    return os.open(path, flags, 0o644), False


class DirectWriter:
    """A file (created or emptied) written through one aligned buffer; `close` writes the
    unaligned tail."""

    def __init__(self, path: Path) -> None:
        self._fd, self._direct = _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._buf = mmap.mmap(-1, CHUNK)
        self._fill = 0

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            n = min(len(view), CHUNK - self._fill)
            self._buf[self._fill:self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == CHUNK:
                self._flush(CHUNK)

    def _flush(self, n: int) -> None:
        self._write(0, n)
        self._fill = 0

    def _write(self, start: int, end: int) -> None:
        with memoryview(self._buf) as whole, whole[start:end] as part:
            if os.write(self._fd, part) != end - start:  # all or nothing, but for a full disk
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        """Write what is buffered (the file's tail) and close; the caller syncs if it must."""
        try:
            tail, aligned = self._fill, self._fill - self._fill % ALIGN
            if aligned:
                self._write(0, aligned)
            if tail > aligned:
                if self._direct:  # a last partial block cannot go direct
                    flags = fcntl.fcntl(self._fd, fcntl.F_GETFL)
                    fcntl.fcntl(self._fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)
                self._write(aligned, tail)
            self._fill = 0
        finally:
            self.abort()

    def abort(self) -> None:
        """Close without writing what is buffered."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._buf.close()

    def __enter__(self) -> DirectWriter:
        return self

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()


class DirectReader(io.RawIOBase):
    """A file opened for reading, filled one aligned block at a time; `read(n)` answers from
    it. Seekable (an upload that is retried starts over)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._fd, _ = _open(path, os.O_RDONLY)
        self._buf = mmap.mmap(-1, CHUNK)
        self._at = 0  # the file offset of the buffer's first byte
        self._have = 0  # bytes valid in the buffer
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos,
                io.SEEK_END: os.fstat(self._fd).st_size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _fill(self) -> int:
        """Make the buffer hold `_pos`; the bytes from there that it holds."""
        if not self._at <= self._pos < self._at + self._have:
            self._at = self._pos - self._pos % ALIGN
            self._have = os.preadv(self._fd, [self._buf], self._at)
        return max(0, self._at + self._have - self._pos)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        n = min(size, self._fill())
        start = self._pos - self._at
        self._pos += n
        return self._buf[start:start + n]

    def readinto(self, b: Any) -> int:
        with memoryview(b) as out:
            n = min(len(out), self._fill())
            start = self._pos - self._at
            out[:n] = self._buf[start:start + n]
        self._pos += n
        return n

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._buf.close()
        super().close()


def read_range(path: Path, start: int, length: int) -> Iterator[memoryview]:
    """`length` bytes of `path` from `start`, as views of one reused buffer (each is only
    valid until the next is asked for); fewer when the file is shorter. The buffer is left to
    the collector: a caller may still hold the last view when this ends."""
    fd, _ = _open(path, os.O_RDONLY)
    buf = mmap.mmap(-1, CHUNK)
    try:
        pos = start - start % ALIGN  # direct reads start on a block
        skip, left = start - pos, length
        while left > 0:
            got = os.preadv(fd, [buf], pos)
            if got <= skip:
                return
            view = memoryview(buf)[skip:min(got, skip + left)]
            yield view
            left -= len(view)
            pos += got
            skip = 0
            if got < CHUNK:
                return
    finally:
        os.close(fd)
