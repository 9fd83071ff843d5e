"""A tick's SSH checks shared between operator machines (PostgreSQL): the leader posts the
boxes to check (`post`), any operator machine's `fleet loop`, the leader's too, claims a batch
(`claim`: `FOR UPDATE SKIP LOCKED`, so two machines never take the same row, under a random
token and an expiry), checks it and stores each result only where its token still holds
(`store`). A claim not answered by its expiry is open again: a machine killed with a claim
delays its boxes' checks, it never loses them. `take_over` gives the leader every box still
unanswered, whoever claimed it: a result stored late under the old token is ignored.

Times are the database server's clock (`_now`), so machines whose clocks differ agree on
when a claim expires.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fleet.core.verdicts import Health
from fleet.state.db import Database, Tx

if TYPE_CHECKING:
    from fleet.state.leader import Fence

CLAIM_S = 90.0  # a claim's life: longer than one batch's checks (`fleet.ops.check`)
BATCH = 32  # boxes one claim takes: what one check runs at once


@dataclass(frozen=True)
class Claim:
    tick: int
    token: str
    hosts: list[tuple[str, dict[str, Any]]]  # (label, its inventory entry), as posted


def _now(tx: Tx) -> float:
    if tx.postgres:
        row = tx.one("SELECT EXTRACT(EPOCH FROM clock_timestamp())")
        return float(row[0]) if row else time.time()
    return time.time()


def post(db: Database, tick: int, hosts: list[tuple[str, dict[str, Any]]],
         fence: Fence | None = None) -> None:
    """Open tick `tick`'s checks of `hosts`: every other tick's are removed, and a box the
    tick posted before is open again (a new leader that took over in the same tick)."""
    with db.write() as tx:
        if fence is not None:  # a former leader's post would take the new one's checks away
            fence.check(tx)
        tx.q("DELETE FROM check_claims")
        tx.many("INSERT INTO check_claims (tick, label, host) VALUES (?, ?, ?)",
                [(tick, label, json.dumps(data)) for label, data in hosts])


def _take(db: Database, where: str, params: tuple[Any, ...], limit: int | None,
          claim_s: float) -> Claim | None:
    token = secrets.token_hex(16)
    with db.rows() as tx:
        until = _now(tx) + claim_s
        skip = " FOR UPDATE SKIP LOCKED" if tx.postgres else ""
        rows = tx.q(f"SELECT tick, label, host FROM check_claims WHERE result IS NULL AND "
                    f"{where} ORDER BY tick, label"
                    f"{'' if limit is None else f' LIMIT {int(limit)}'}{skip}",
                    (*params,))
        if not rows:
            return None
        tick = int(rows[0][0])
        rows = [r for r in rows if int(r[0]) == tick]
        tx.many("UPDATE check_claims SET token = ?, claimed_until = ? WHERE tick = ? AND "
                "label = ?", [(token, until, tick, r[1]) for r in rows])
    return Claim(tick, token, [(str(r[1]), json.loads(r[2])) for r in rows])


def claim(db: Database, limit: int = BATCH, claim_s: float = CLAIM_S) -> Claim | None:
    """Up to `limit` open checks (never claimed, or their claim expired), now this
    machine's for `claim_s` seconds; None when there are none."""
    with db.read() as tx:
        now = _now(tx)
    return _take(db, "(token IS NULL OR claimed_until < ?)", (now,), limit, claim_s)


def take_over(db: Database, tick: int, claim_s: float = CLAIM_S) -> Claim | None:
    """Every unanswered check of `tick`, claimed or not: the leader checks them itself."""
    return _take(db, "tick = ?", (tick,), None, claim_s)


def store(db: Database, c: Claim, health: list[Health]) -> list[Health]:
    """Each box's result, where `c`'s token still holds it (nothing else claimed it since):
    those stored."""
    stored = []
    with db.rows() as tx:
        for h in health:
            if tx.q("UPDATE check_claims SET result = ? WHERE tick = ? AND label = ? AND "
                    "token = ? AND result IS NULL RETURNING label",
                    (json.dumps(h.to_dict()), c.tick, h.label, c.token)):
                stored.append(h)
    return stored


def results(db: Database, tick: int) -> dict[str, Health]:
    """The checks of `tick` answered so far, by label. A result that does not read is no
    result: that box is checked again."""
    with db.read() as tx:
        rows = tx.q("SELECT label, result FROM check_claims WHERE tick = ? AND result IS NOT "
                    "NULL", (tick,))
    out = {}
    for label, doc in rows:
        try:
            out[str(label)] = Health.from_dict(json.loads(doc))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            continue
    return out


def unanswered(db: Database, tick: int) -> int:
    with db.read() as tx:
        row = tx.one("SELECT COUNT(*) FROM check_claims WHERE tick = ? AND result IS NULL",
                     (tick,))
    return int(row[0]) if row else 0
