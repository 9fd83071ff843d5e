"""Small documents of the fleet's state, one row each in the database's `docs` table: the
loop's memory (`loop`), the last bills read (`bills`). Each is replaced whole in one write
transaction, so a reader never sees half of one."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fleet.core.times import now_iso

if TYPE_CHECKING:
    from fleet.state.db import Database, Tx
    from fleet.state.leader import Fence


def get(db: Database, name: str) -> Any | None:
    """The document `name` as JSON values, or None when there is none; ValueError when the
    stored text is not JSON."""
    with db.read() as tx:
        found = tx.one("SELECT doc FROM docs WHERE name = ?", (name,))
    return None if found is None else json.loads(found[0])


def put_in(tx: Tx, name: str, doc: Any) -> None:
    tx.q("INSERT INTO docs (name, doc, updated_at) VALUES (?, ?, ?) ON CONFLICT (name) "
         "DO UPDATE SET doc = excluded.doc, updated_at = excluded.updated_at",
         (name, json.dumps(doc, separators=(",", ":")), now_iso()))


def put(db: Database, name: str, doc: Any, fence: Fence | None = None) -> None:
    """Replace the document `name`; with `fence`, only while that leader still leads."""
    with db.write() as tx:
        if fence is not None:
            fence.check(tx)
        put_in(tx, name, doc)
