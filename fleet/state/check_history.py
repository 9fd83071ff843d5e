"""What `fleet check` remembers of each box between two checks (the `check_history` table): its
node's tip and when it was read, so the next check can tell a node that stopped moving."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleet.state.db import open_db

if TYPE_CHECKING:
    from pathlib import Path


def load(registry: Path) -> dict[str, Any]:
    """Label -> what the last check remembered of it."""
    with open_db(registry).read() as tx:
        rows = tx.q("SELECT label, doc FROM check_history")
    out: dict[str, Any] = {}
    for label, doc in rows:
        try:
            out[label] = json.loads(doc)
        except ValueError:
            continue  # a damaged entry says nothing: the box is checked as if first seen
    return out


def save(registry: Path, entries: Mapping[str, Any]) -> None:
    """Replace the entries of the labels in `entries`, in one transaction."""
    with open_db(registry).write() as tx:
        tx.many("INSERT INTO check_history (label, doc) VALUES (?, ?) ON CONFLICT (label) "
                "DO UPDATE SET doc = excluded.doc",
                [(label, json.dumps(doc)) for label, doc in entries.items()])
