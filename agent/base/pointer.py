"""The standing pointer: /root/fleet/standing.node names the node binary to run.

`standing.node` holds one line, the binary's absolute path; `standing.node.sha256` beside it
holds the binary's full hex sha256 (a `sha256sum` line is accepted too). A pointer is taken
only when the file exists, is executable and matches the digest; otherwise it is refused with
a reason and checked again on the next tick (the binary may still be on its way).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from agent.contract import Layout

HEX64 = re.compile(r"^[0-9a-f]{64}$")
PENDING = "being hashed, or waiting for the file to stay unchanged"
MAX_POINTER_BYTES = 4096  # one path (or one sha256sum line); anything larger is not a pointer


@dataclass(frozen=True)
class Pointer:
    target: str  # the first line of standing.node
    digest_text: str  # the first word of standing.node.sha256, lowercased ("" if absent)
    problem: str | None = None  # a pointer file that cannot be a pointer (refused)

    @property
    def key(self) -> str:
        """Identity of this pointer's content: a rewrite changes it."""
        return f"{self.target}\n{self.digest_text}"


@dataclass(frozen=True)
class Verdict:
    ok: bool
    path: str
    sha256: str | None = None
    reason: str | None = None
    pending: bool = False  # the file's digest is not known yet: asked again later


def pointer_signature(layout: Layout) -> tuple[tuple[int, int, int] | None, ...]:
    """Cheap identity of both pointer files (two stats): unchanged means nothing to do."""
    out: list[tuple[int, int, int] | None] = []
    for path in (layout.pointer, layout.pointer_digest):
        try:
            st = os.stat(path)
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def read_pointer(layout: Layout) -> Pointer | None:
    """The pointer, or None when standing.node does not exist."""
    try:
        target = _read_small(layout.pointer).strip().splitlines()
    except FileNotFoundError:
        return None
    except _NotAPointer as e:
        return Pointer("", "", str(e))
    except OSError:
        target = []
    try:
        words = _read_small(layout.pointer_digest).split()
    except _NotAPointer as e:
        return Pointer(target[0].strip() if target else "", "", str(e))
    except OSError:
        words = []
    return Pointer(target[0].strip() if target else "", words[0].lower() if words else "")


class _NotAPointer(Exception):
    pass


def _read_small(path: Path) -> str:
    """A pointer file's text. O_NONBLOCK, so a FIFO in its place cannot hang the agent; not a
    regular file, or larger than a pointer can be: _NotAPointer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _NotAPointer(f"{path.name} is not a regular file")
        if st.st_size > MAX_POINTER_BYTES:
            raise _NotAPointer(f"{path.name} is {st.st_size} bytes, larger than a pointer "
                               f"can be ({MAX_POINTER_BYTES})")
        return os.read(fd, MAX_POINTER_BYTES + 1).decode(errors="replace")
    finally:
        os.close(fd)


Digest = Callable[[str], tuple[str | None, os.stat_result]]  # (sha256 or None: not known yet)


def check_pointer(pointer: Pointer, digest: Digest) -> Verdict:
    """Whether the pointer can be taken. `digest` is a DigestCache's (hashes at once) or the
    agent's digest worker's lookup (None while the file is being hashed: a pending verdict)."""
    path = pointer.target

    def refuse(reason: str) -> Verdict:
        return Verdict(False, path, None, reason)

    problem = _misread(pointer)
    if problem:
        return refuse(problem)
    try:  # one open: the file checked is the file hashed (a swap in between cannot split them)
        actual, st = digest(path)
    except FileNotFoundError:
        return refuse(f"{path} does not exist")
    except OSError as e:
        return refuse(f"{path} cannot be read: {e.strerror or e}")
    if not st.st_mode & 0o111 or not os.access(path, os.X_OK):
        return refuse(f"{path} is not executable")
    if actual is None:
        return Verdict(False, path, None, f"{path}: its sha256 is not known yet ({PENDING})",
                       pending=True)
    if actual != pointer.digest_text:
        return refuse(
            f"{path} has sha256 {actual[:16]}..., standing.node.sha256 says "
            f"{pointer.digest_text[:16]}..."
        )
    return Verdict(True, path, actual)


def _misread(pointer: Pointer) -> str | None:
    """What is wrong with the pointer's two files as written (before the binary is looked
    at), or None."""
    path = pointer.target
    if pointer.problem:
        return pointer.problem
    if not path:
        return "standing.node is empty"
    if "\0" in path:
        return "standing.node holds a NUL byte"
    if not os.path.isabs(path):
        return f"standing.node names {path!r}, not an absolute path"
    if not pointer.digest_text:
        return "standing.node.sha256 is missing or empty"
    if not HEX64.match(pointer.digest_text):
        return f"standing.node.sha256 holds {pointer.digest_text[:20]!r}, not a sha256"
    return None
