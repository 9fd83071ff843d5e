"""The object ids the Hub shows: git blob sha1s, LFS pointer files, commit and tree ids."""

from __future__ import annotations

import hashlib
import json
from typing import Any

LFS_SPEC = "https://git-lfs.github.com/spec/v1"


def git_blob_oid(data: bytes) -> str:
    """git's id of a blob: sha1 over `blob <len>\\0` and the bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The pointer file git stores in place of an LFS file."""
    return f"version {LFS_SPEC}\noid sha256:{sha256}\nsize {size}\n".encode()


def content_oid(obj: Any) -> str:
    """A 40-hex id of a JSON-able value (commit ids from content and parent, tree ids)."""
    canonical = json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha1(canonical).hexdigest()
