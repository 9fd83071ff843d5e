"""Size-based log rotation, copy-truncate style.

Programs keep their log file descriptors (opened O_APPEND), so the file cannot be renamed away
under them: its tail, at most max_bytes from the first whole line on, is copied to <log>.1
(older copies shift to .2 ... .keep) and the file is truncated in place; the next append lands
at offset 0. So a rotation reads and needs free disk for max_bytes at most, however far the log
grew past it between two reconciles. Lines before the tail, and lines written between the copy
and the truncate, are lost: the usual price of copy-truncate.

A failed copy (a full disk) never leaves its temporary file behind, and the log is truncated
anyway: on a full disk an untruncated log keeps growing and a leftover copy takes the space
that was freed again at every reconcile. Losing old lines is the lesser harm.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path


def rotate_if_big(path: Path, max_bytes: int, keep: int) -> bool:
    """True when the log was rotated; OSError (after truncating it) when the copy failed."""
    try:
        size = path.stat().st_size
    except OSError:
        return False
    if size <= max_bytes:
        return False
    tmp = path.with_name(f".{path.name}.1.tmp")
    try:
        _copy_tail(path, tmp, size, max_bytes)
        _shift(path, keep)
        os.replace(tmp, path.with_name(f"{path.name}.1"))
    finally:
        tmp.unlink(missing_ok=True)
        os.truncate(path, 0)
    return True


def _copy_tail(path: Path, tmp: Path, size: int, max_bytes: int) -> None:
    """The last max_bytes of the log's first `size` bytes, from the first whole line on
    (from the cut itself when the tail holds no line end)."""
    start = max(0, size - max_bytes)
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        if start:
            src.seek(start - 1)
            head = src.read(min(size - start + 1, 1 << 16))
            cut = head.find(b"\n")
            start += cut if 0 <= cut < len(head) - 1 else 0
            src.seek(start)
        remaining = size - start
        while remaining > 0:
            block = src.read(min(remaining, 1 << 20))
            if not block:
                break
            dst.write(block)
            remaining -= len(block)


def _shift(path: Path, keep: int) -> None:
    """.n -> .n+1 through hard links, so that every name keeps existing while a reader looks
    (a rename would leave a moment with no .1)."""
    for n in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{n}")
        if older.exists():
            link = path.with_name(f".{path.name}.{n + 1}.tmp")
            link.unlink(missing_ok=True)
            try:
                os.link(older, link)
                os.replace(link, path.with_name(f"{path.name}.{n + 1}"))
            finally:
                link.unlink(missing_ok=True)


def rotate_logs(paths: Iterable[Path], max_bytes: int, keep: int,
                journal: Callable[[str], None]) -> None:
    """Rotate each log that is too big; a failure is logged, never raised (a full disk)."""
    for path in paths:
        try:
            if rotate_if_big(path, max_bytes, keep):
                journal(f"rotated {path}")
        except OSError as e:
            journal(f"cannot rotate {path} ({e}); truncated it anyway")
