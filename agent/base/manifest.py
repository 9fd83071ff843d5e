"""`python -m agent manifest DIR`: path, size and sha256 of every regular file under DIR.

With `--tar --save FILE` the files go to stdout as one tar stream instead, each read once and
hashed as it is sent: `out/<path>` members, then `manifest.json` (the manifest of exactly the
bytes sent, with each file's mtime), also saved to FILE on the box. A file written to while it
was read is marked `changed`. `--unchanged-since FILE` then compares sizes and mtimes with that
saved manifest, reading no file's bytes: what changed after the read, one line each (JSON).

Only regular files are outputs. Anything else under DIR is never followed nor sent, but it is
never dropped silently either: each one is an entry of its own, in the same sorted list, with
no size and no sha256, so that a reader expecting files fails closed on it:
`{"path": P, "link": TARGET}` for a symbolic link (to a file or a folder; TARGET as readlink
gives it) and `{"path": P, "special": "fifo"|"socket"|"device"}` for anything else.

A DIR that does not exist holds no outputs (a job stopped before its run never made its outputs
folder): an empty manifest. A DIR that exists but is not a folder (or is a symbolic link) is an
error, exit 2.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from agent.base.errors import usage_error
from agent.base.files import sha256_file, write_json
from agent.contract import ManifestEntry

OUT_PREFIX = "out/"  # output members of the stream; the manifest member is outside it
STREAM_MANIFEST = "manifest.json"
CHUNK = 1 << 20


def _walk(root: Path) -> tuple[list[tuple[str, Path]], list[ManifestEntry]]:
    """(relative path, path) of each regular file under root, sorted, and an entry for each
    thing that is not one (a link, a fifo, ...): never followed, never read."""
    if not os.path.lexists(root):
        return [], []
    if root.is_symlink() or not root.is_dir():
        raise usage_error(f"{root} is not a directory")
    found: list[tuple[str, Path]] = []
    others: list[ManifestEntry] = []
    for dirpath, dirnames, filenames in os.walk(root):  # does not descend into symlinked dirs
        dirnames.sort()
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                others.append({"path": rel, "link": os.readlink(path)})
            elif stat.S_ISREG(st.st_mode):
                found.append((rel, path))
            elif not stat.S_ISDIR(st.st_mode):
                others.append({"path": rel, "special": _kind(st.st_mode)})
    return sorted(found), others


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "fifo"
    return "socket" if stat.S_ISSOCK(mode) else "device"


def _files(root: Path) -> Iterator[tuple[str, Path]]:
    return iter(_walk(root)[0])


def _sorted(entries: list[ManifestEntry]) -> list[ManifestEntry]:
    return sorted(entries, key=lambda e: str(e["path"]))


def manifest(root: Path) -> list[ManifestEntry]:
    files, others = _walk(root)
    entries: list[ManifestEntry] = [
        {"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)}
        for rel, path in files]
    return _sorted(entries + others)


def stream(root: Path, out: IO[bytes], save: Path) -> list[ManifestEntry]:
    """Write root's files to `out` as a tar stream, then their manifest; save it to `save`.

    tarfile writes each header (`TarInfo.tobuf`, PAX for long names and large sizes); the
    bytes go from the file through one reused buffer to the hash and `out`, where tarfile's
    own stream would copy every chunk twice more."""
    entries: list[ManifestEntry] = []
    buf = memoryview(bytearray(CHUNK))
    _widen_pipe(out)
    files, others = _walk(root)
    for rel, path in files:
        with open(path, "rb", buffering=0) as f:
            before = os.fstat(f.fileno())
            info = tarfile.TarInfo(OUT_PREFIX + rel)
            info.size, info.mtime, info.mode = before.st_size, int(before.st_mtime), 0o644
            out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
            digest = _send(f, before.st_size, buf, out, rel)
            after = os.stat(path)
        entry: ManifestEntry = {"path": rel, "size": before.st_size, "sha256": digest,
                                "mtime_ns": before.st_mtime_ns}
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            entry["changed"] = True
        entries.append(entry)
    entries = _sorted(entries + others)
    write_json(save, entries, durable=True)
    blob = json.dumps(entries).encode()
    info = tarfile.TarInfo(STREAM_MANIFEST)
    info.size, info.mode = len(blob), 0o644
    out.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
    out.write(blob + _padding(len(blob)))
    out.write(tarfile.NUL * (2 * tarfile.BLOCKSIZE))  # the end of the archive
    out.flush()
    return entries


def _send(f: IO[bytes], size: int, buf: memoryview, out: IO[bytes], rel: str) -> str:
    """Exactly `size` bytes of `f` (its size when the header was written) to `out`, hashed on
    the way with OpenSSL's sha256 (this command is short-lived, so its RSS does not matter;
    the agent's built-in one is several times slower on hosts with SHA extensions); then the
    padding. A file that shrank meanwhile cannot fill its member: an error, not a short file."""
    h, left = hashlib.sha256(), size
    while left:
        n = f.readinto(buf[:min(left, len(buf))])  # type: ignore[attr-defined]
        if not n:
            raise OSError(f"{rel}: shrank while it was read ({size - left} of {size} bytes)")
        h.update(buf[:n])
        out.write(buf[:n])
        left -= n
    out.write(_padding(size))
    return h.hexdigest()


def _widen_pipe(out: IO[bytes]) -> None:
    """1 MiB for the pipe to sshd, where `out` is one (Linux): fewer, larger hand-overs."""
    with contextlib.suppress(OSError, AttributeError, ValueError, io.UnsupportedOperation):
        fd = out.fileno()
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, CHUNK)


def _padding(size: int) -> bytes:
    return tarfile.NUL * (-size % tarfile.BLOCKSIZE)


def unchanged_since(root: Path, saved: Path) -> list[str]:
    """What differs, by size and mtime, between root's files now and the saved manifest."""
    try:
        was = {e["path"]: e for e in json.loads(saved.read_text())}
    except (OSError, ValueError, TypeError, KeyError) as e:
        return [f"{saved}: the manifest of the last read is not readable ({e})"]
    problems = []
    files, others = _walk(root)
    now = {rel: path.stat() for rel, path in files}
    for other in others:
        what = f"a symbolic link to {other['link']}" if "link" in other else \
            f"a {other['special']}"
        problems.append(f"{other['path']}: {what}, not a file: never read back")
    was = {rel: entry for rel, entry in was.items() if "sha256" in entry}
    for rel in sorted(set(was) | set(now)):
        if rel not in now:
            problems.append(f"{rel}: gone from the box since it was read")
        elif rel not in was:
            problems.append(f"{rel}: new on the box since the outputs were read")
        elif (now[rel].st_size, now[rel].st_mtime_ns) != (was[rel]["size"],
                                                          was[rel].get("mtime_ns")):
            problems.append(f"{rel}: written to on the box after it was read "
                            f"({was[rel]['size']} -> {now[rel].st_size} bytes)")
    return problems
