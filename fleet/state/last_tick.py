"""The loop's last tick, in the state database: what a page drawn without provider keys shows
for the boxes it cannot check itself.

The loop's after-tick hook saves, each tick, the tick's number and time, every standing box's
verdict (`Health`), the boxes owed and the providers that failed; `fleet page` on a machine
without the providers' keys reads it back. A tick is a `ticks` row (its number, `at`: when it
started, its checks no older; `saved_at`: when it ended; the boxes owed and the providers that
failed, as JSON lists) and a `tick_health` row per box it judged, written in one transaction
with the older ticks' rows removed, so a reader never sees half a tick and no size caps it.
`load` never raises for a damaged tick: it returns None, and the page then says that no tick is
on record.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet.core.times import iso, parse_iso
from fleet.core.verdicts import Health, Owed
from fleet.state.db import Tx, open_db

if TYPE_CHECKING:
    from fleet.state.leader import Fence

SCHEMA = 1
STALE_INTERVALS = 2  # a tick older than this many loop intervals: the loop may have stopped


@dataclass(frozen=True)
class LastTick:
    """One tick's verdicts, as the loop left them."""

    number: int
    at: str  # UTC ISO-8601: the tick's start (its checks are no older than that)
    health: tuple[Health, ...] = ()
    owed: tuple[Owed, ...] = ()
    provider_errors: tuple[str, ...] = ()
    saved_at: str = ""  # UTC ISO-8601: when the file was written ("" when unknown)

    def verdict(self, label: str) -> Health | None:
        """The tick's verdict on the box `label`, or None when the tick did not check it."""
        by_label = self.__dict__.get("_by_label")
        if by_label is None:  # built once: the page asks this of every box
            by_label = {h.label: h for h in reversed(self.health)}
            object.__setattr__(self, "_by_label", by_label)
        return by_label.get(label)

    def age_s(self, now: datetime) -> float:
        """Seconds from the tick's start to `now` (negative when the tick's clock runs ahead)."""
        return (now - parse_iso(self.at)).total_seconds()

    def stale(self, now: datetime, interval_s: float) -> bool:
        """Older than `STALE_INTERVALS` loop intervals, or ahead of this clock by more than one
        interval: either way the tick says little about now."""
        age = self.age_s(now)
        return age > STALE_INTERVALS * interval_s or age < -interval_s

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "number": self.number, "at": self.at,
                "saved_at": self.saved_at, "health": [h.to_dict() for h in self.health],
                "owed": [o.to_dict() for o in self.owed],
                "provider_errors": list(self.provider_errors)}


def save(registry: Path, number: int, started_at: str, health: Sequence[Health],
         owed: Sequence[Owed] = (), provider_errors: Sequence[str] = (),
         now: datetime | None = None, fence: Fence | None = None) -> LastTick:
    """Record the tick in the fleet's state, whole, in place of the ones before; with `fence`,
    only while that leader leads."""
    tick = LastTick(number, started_at, tuple(health), tuple(owed), tuple(provider_errors),
                    iso(now or datetime.now(UTC)))
    with open_db(registry).write() as tx:
        if fence is not None:
            fence.check(tx)
        save_in(tx, tick)
    return tick


def save_in(tx: Tx, tick: LastTick) -> None:
    """`tick` in place of the ones before, within the transaction `tx`."""
    d = tick.to_dict()
    tx.q("DELETE FROM tick_health")
    tx.q("DELETE FROM ticks")
    tx.q("INSERT INTO ticks (number, at, saved_at, owed, provider_errors) VALUES (?, ?, ?, ?, ?)",
         (tick.number, tick.at, tick.saved_at, json.dumps(d["owed"]),
          json.dumps(d["provider_errors"])))
    tx.many("INSERT INTO tick_health (number, pos, label, doc) VALUES (?, ?, ?, ?)",
            [(tick.number, i, h["label"], json.dumps(h)) for i, h in enumerate(d["health"])])


def load(registry: Path) -> LastTick | None:
    """The last tick recorded, or None: none yet, or one that cannot be read whole (a wrong
    type anywhere). Never raises for its content."""
    with open_db(registry).read() as tx:
        return load_in(tx)


def load_in(tx: Tx) -> LastTick | None:
    """`load`, within the transaction `tx`."""
    top = tx.one("SELECT number, at, saved_at, owed, provider_errors FROM ticks "
                 "ORDER BY number DESC LIMIT 1")
    if top is None:
        return None
    health = tx.q("SELECT doc FROM tick_health WHERE number = ? ORDER BY pos", (top[0],))
    try:
        return _read({"schema": SCHEMA, "number": top[0], "at": top[1], "saved_at": top[2],
                      "owed": json.loads(top[3]), "provider_errors": json.loads(top[4]),
                      "health": [json.loads(h[0]) for h in health]})
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None


def _read(d: Mapping[str, Any]) -> LastTick:
    """The tick in `d`, every field checked: ValueError (or KeyError, TypeError) otherwise."""
    if d["schema"] != SCHEMA:
        raise ValueError(f"last tick schema {d['schema']!r}")
    number = d["number"]
    if not isinstance(number, int) or isinstance(number, bool):
        raise ValueError("tick number")
    at = str(d["at"])
    parse_iso(at)  # a tick without a readable time cannot be dated on the page
    errors = d["provider_errors"]
    if not isinstance(errors, list) or not all(isinstance(e, str) for e in errors):
        raise ValueError("provider_errors")
    return LastTick(number, at, tuple(Health.from_dict(h) for h in d["health"]),
                    tuple(_owed(o) for o in d["owed"]), tuple(errors),
                    str(d.get("saved_at") or ""))


def _owed(o: Mapping[str, Any]) -> Owed:
    gpus = o["gpus"]
    if not isinstance(gpus, int) or isinstance(gpus, bool):
        raise ValueError("owed gpus")
    return Owed(str(o["role"]), str(o["provider"]), str(o["card"]), gpus, since=str(o["since"]),
                reason=str(o["reason"]))
