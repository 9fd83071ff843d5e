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
    """Label -> what the last check remembered of it. An entry that does not read as what the
    check writes says nothing: its box is checked as if first seen."""
    with open_db(registry).read() as tx:
        rows = tx.q("SELECT label, doc FROM check_history")
    out: dict[str, Any] = {}
    for label, doc in rows:
        try:
            entry = json.loads(doc)
        except (ValueError, RecursionError):
            continue
        if _readable(entry):
            out[label] = entry
    return out


def _readable(entry: Any) -> bool:
    """{"exec_tip": int, "moving": bool | None, "rpc_at": str | None, "at": number}, as
    `fleet.ops.check` writes it."""
    if not isinstance(entry, dict):
        return False
    tip, moving, rpc_at = entry.get("exec_tip"), entry.get("moving"), entry.get("rpc_at")
    return (isinstance(tip, int) and not isinstance(tip, bool)
            and (moving is None or isinstance(moving, bool))
            and (rpc_at is None or isinstance(rpc_at, str)))


def save(registry: Path, entries: Mapping[str, Any]) -> None:
    """Replace the entries of the labels in `entries`, in one transaction."""
    with open_db(registry).write() as tx:
        tx.many("INSERT INTO check_history (label, doc) VALUES (?, ?) ON CONFLICT (label) "
                "DO UPDATE SET doc = excluded.doc",
                [(label, json.dumps(doc)) for label, doc in entries.items()])
