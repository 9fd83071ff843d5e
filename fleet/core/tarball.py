"""Deterministic tarballs: the same files give the same bytes, so a digest names one content.

Every deploy artefact the operator ships (the agent bundle, release tarballs) is built here:
names sorted, mtimes zero, owner root (uid/gid 0), modes as given, PAX format, and with
`gzip=True` a gzip stream whose header carries no time or file name.

Example:
    data = deterministic_tar([Entry("agent/cli.py", code), Entry("in/run.sh", script, 0o755)],
                             gzip=True)
"""

from __future__ import annotations

import gzip as gzip_mod
import io
import tarfile
from collections.abc import Iterable
from typing import NamedTuple


class Entry(NamedTuple):
    name: str  # "/"-separated path inside the archive, relative
    data: bytes
    mode: int = 0o644


def _check_name(name: str) -> None:
    parts = name.split("/")
    if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"archive names must be relative paths without '..': {name!r}")


def deterministic_tar(entries: Iterable[Entry], gzip: bool = False) -> bytes:
    """The tarball of `entries` (regular files), byte-identical for identical entries."""
    files = sorted(entries, key=lambda e: e.name)
    for i, e in enumerate(files):
        _check_name(e.name)
        if i and files[i - 1].name == e.name:
            raise ValueError(f"archive name given twice: {e.name!r}")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in files:
            info = tarfile.TarInfo(e.name)
            info.size, info.mode, info.mtime = len(e.data), e.mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            tar.addfile(info, io.BytesIO(e.data))
    data = raw.getvalue()
    if not gzip:
        return data
    out = io.BytesIO()
    # gzip's header carries an mtime (and a name when given a file): zero both
    with gzip_mod.GzipFile(filename="", fileobj=out, mode="wb", mtime=0) as gz:
        gz.write(data)
    return out.getvalue()
