"""Writes that may fail (a full disk, an unwritable run/): each is tried, its failure recorded
by what it wrote and reported in the status's `storage`, never raised into the loop, and
cleared as soon as the same write succeeds again."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class Storage:
    def __init__(self, journal: Callable[[str], None]) -> None:
        self.journal = journal
        self._failing: dict[str, tuple[str, float]] = {}  # what -> (error, since)

    def attempt(self, what: str, write: Callable[[], object]) -> bool:
        try:
            write()
        except OSError as e:
            if what not in self._failing:
                error = f"cannot write {what}: {e.strerror or e}"
                self.journal(error)
                self._failing[what] = (error, time.time())
            return False
        if self._failing.pop(what, None) is not None:
            self.journal(f"{what} written again")
        return True

    def view(self) -> dict[str, Any]:
        if not self._failing:
            return {"ok": True, "error": None, "since": None, "failing": []}
        error, since = min(self._failing.values(), key=lambda e: e[1])
        return {"ok": False, "error": error, "since": since, "failing": sorted(self._failing)}
