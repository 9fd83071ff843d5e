"""Faults armed on the Hub server: each hits the next `count` matching requests.

- `store_upload_refused`: the next write (an LFS batch upload request or a commit) is answered
  403, as a Hub that refuses the token's write or the repository's quota would.
- `store_wrong_bytes`: the next download of a file's bytes (GET resolve) sends other bytes of
  the same length under the right file's headers (ETag, X-Linked-Etag, sizes).
- `store_busy`: the next download of a file's bytes (GET resolve) is answered 429 with
  `Retry-After: 1`, as a rate-limited Hub answers; a client that asks again gets the bytes.
- `store_ghost_commit`: the next commit answers success with a commit id, but nothing is stored:
  the branch does not move and that id does not resolve.

A fault may name a repository (`ns/name`); without one it hits any.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass
from typing import Any

UPLOAD_REFUSED = "store_upload_refused"
WRONG_BYTES = "store_wrong_bytes"
GHOST_COMMIT = "store_ghost_commit"
BUSY = "store_busy"
FAULT_KINDS = (UPLOAD_REFUSED, WRONG_BYTES, GHOST_COMMIT, BUSY)


@dataclass
class HubFault:
    id: int
    kind: str
    count: int
    repo: str | None
    hits: int = 0


class HubFaults:
    def __init__(self) -> None:
        self._faults: list[HubFault] = []
        self._ids = 0
        self._lock = threading.Lock()

    def add(self, kind: str, count: int = 1, repo: str | None = None) -> dict[str, Any]:
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown store fault {kind!r}; known: {', '.join(FAULT_KINDS)}")
        if count < 1:
            raise ValueError("count must be at least 1")
        if repo in ("", "*"):
            repo = None
        with self._lock:
            self._ids += 1
            fault = HubFault(self._ids, kind, count, repo)
            self._faults.append(fault)
            return asdict(fault)

    def take(self, kind: str, repo_id: str) -> bool:
        """Whether the oldest armed `kind` fault matching `repo_id` hits this request (used)."""
        with self._lock:
            for fault in self._faults:
                if fault.kind == kind and fault.repo in (None, repo_id):
                    fault.count -= 1
                    fault.hits += 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                    return True
        return False

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return [asdict(f) for f in self._faults]

    def clear(self) -> int:
        with self._lock:
            n = len(self._faults)
            self._faults.clear()
            return n
