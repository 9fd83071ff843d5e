"""The loop's last tick (`last_tick.json` beside the registry): what a page drawn without
provider keys shows for the boxes it cannot check itself.

The loop's after-tick hook saves, each tick, the tick's number and time, every standing box's
verdict (`Health`), the boxes owed and the providers that failed; `fleet page` on a machine
without the providers' keys reads it back. The file is replaced whole (temp file and rename),
so a reader never sees half a tick. `load` never raises for a missing, damaged or foreign file:
it returns None, and the page then says that no tick is on record.

`last_tick.json`:

    {"schema": 1,
     "number": 42,                          the loop's tick counter (loop.json's `tick`)
     "at": "2026-12-04T17:03:00Z",          when the tick started: its checks are no older
     "saved_at": "2026-12-04T17:03:41Z",    when the tick ended and this file was written
     "health": [Health.to_dict(), ...],     each standing box the tick checked
     "owed": [Owed.to_dict(), ...],         the boxes it could not rent, with why
     "provider_errors": ["vast list: ..."]} providers whose boxes it could not judge
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fleet.core.fileutil import read_small, write_atomic
from fleet.core.times import iso, parse_iso
from fleet.core.verdicts import Health, Owed

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
        return next((h for h in self.health if h.label == label), None)

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


def path_for(registry: Path) -> Path:
    return registry.parent / "last_tick.json"


def save(registry: Path, number: int, started_at: str, health: Sequence[Health],
         owed: Sequence[Owed] = (), provider_errors: Sequence[str] = (),
         now: datetime | None = None) -> LastTick:
    """Write the tick beside the registry (`last_tick.json`), whole: temp file and rename."""
    tick = LastTick(number, started_at, tuple(health), tuple(owed), tuple(provider_errors),
                    iso(now or datetime.now(UTC)))
    write_atomic(path_for(registry), json.dumps(tick.to_dict(), indent=1) + "\n")
    return tick


def load(registry: Path) -> LastTick | None:
    """The last tick saved beside the registry, or None: none yet, or a file that cannot be
    read whole (damaged, another schema, a wrong type anywhere). Never raises for the file."""
    try:
        d = json.loads(read_small(path_for(registry)))
        return _read(d)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
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
    return Owed(str(o["role"]), str(o["provider"]), str(o["card"]), gpus, str(o["reason"]),
                str(o["since"]))
