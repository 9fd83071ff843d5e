"""The loop's memory (the `loop` document in the state database, `fleet.state.docs`): what one
tick leaves for the next, and the boxes it owes.

Read by the loop, and by `fleet roster` and `fleet page` to show the boxes owed. Saved with the
leader's fence: a loop that lost the lead never writes it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from fleet.core.errors import FleetError
from fleet.core.verdicts import Owed
from fleet.state import docs
from fleet.state.db import open_db

if TYPE_CHECKING:
    from pathlib import Path

    from fleet.state.leader import Fence

NAME = "loop"


@dataclass
class Memory:
    """What a tick leaves for the next (loop.json)."""

    tick: int = 0
    dead: dict[str, int] = field(default_factory=dict)  # label -> consecutive dead checks
    rerents: list[Owed] = field(default_factory=list)  # dead boxes not replaced yet
    owed: list[Owed] = field(default_factory=list)  # the last tick's owed boxes, as reported
    orphans: dict[str, str] = field(default_factory=dict)  # "provider/id" -> first seen
    # "provider/machine" -> when a box on it was found unfit: its offers are passed over
    unfit_machines: dict[str, str] = field(default_factory=dict)
    # network (`Config.network_of`) -> the endpoints its boxes' peers files were last written
    # with (`Loop._peers`)
    peers: dict[str, str] = field(default_factory=dict)
    peers_at: dict[str, str] = field(default_factory=dict)  # network -> when they were written
    # label -> when its provider was first seen restarting it (provisioning, SSH down)
    restarting: dict[str, str] = field(default_factory=dict)
    # the loop's own destroys within the disruption window (`fleet.ops.disruption`)
    disruptions: list[dict[str, Any]] = field(default_factory=list)
    # the providers whose breaker was open at the last tick (`Loop._breakers`)
    breakers: list[str] = field(default_factory=list)
    # label -> what its provider listed ({"uptime_s", "machine"}) at the last tick its standing
    # box answered the loop's SSH under its pinned host key: a changed key is re-pinned only
    # on a restart its provider lists since then (`judgement.repin_refusal`)
    answered: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, registry: Path) -> Memory:
        """The memory of the fleet whose registry path is `registry`."""
        where = f"{NAME} in the state database"
        try:
            d = docs.get(open_db(registry), NAME)
        except ValueError as e:  # not JSON: never read as a fresh memory
            raise FleetError(f"{where}: the loop's memory is not readable ({e}); remove it "
                             "to start afresh") from None
        if d is None:
            return cls()
        return cls.from_dict(d, where)

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Memory:
        try:
            return cls(int(d["tick"]), dict(d["dead"]), [Owed(**o) for o in d["rerents"]],
                       [Owed(**o) for o in d["owed"]], dict(d["orphans"]),
                       dict(d.get("unfit_machines", {})), dict(d.get("peers", {})),
                       dict(d.get("peers_at", {})), dict(d.get("restarting", {})),
                       [dict(r) for r in d.get("disruptions", [])],
                       [str(p) for p in d.get("breakers", [])],
                       {str(k): _answered(v) for k, v in d.get("answered", {}).items()})
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise FleetError(f"{where}: the loop's memory is not readable ({e}); remove it "
                             "to start afresh") from None

    def save(self, registry: Path, fence: Fence | None = None) -> None:
        """Replace the saved memory; with `fence`, only while that leader leads."""
        docs.put(open_db(registry), NAME, asdict(self), fence)


def _answered(v: Any) -> dict[str, Any]:
    """One `answered` record, checked: an uptime (a number or None) and a machine id."""
    up, machine = v["uptime_s"], v["machine"]
    if up is not None and (isinstance(up, bool) or not isinstance(up, int | float)):
        raise ValueError(f"uptime_s {up!r} is not a number")
    return {"uptime_s": None if up is None else float(up),
            "machine": None if machine is None else str(machine)}
