"""The verdicts every layer shows: a standing box's health (`fleet check`), a one-shot box's
watch (the meter watchdog). Judged in `fleet.ops`, drawn by the page and the CLI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from fleet.core.states import DeathKind

# a box's verdict on the page and in the CLI, worst first
VERDICTS = ("down", "problem", "unknown", "well")


class Death(str):
    """Why the loop counts a standing box dead on one tick: its kind (`DeathKind`) and its
    reason. The text is what a tick records (its JSON's `dead`, the disruption budget's
    `why`): the reason, after `unfit: ` where the box is unfit; so a tick's deaths still
    read, compare and dump as that text, while the loop reads the kind, never the text.

    Example: `Death.unfit("its agent refused admission (...)").kind is DeathKind.UNFIT`"""

    __slots__ = ("kind", "reason")
    kind: DeathKind
    reason: str

    def __new__(cls, kind: DeathKind, reason: str) -> Death:
        self = super().__new__(cls, reason if kind is DeathKind.DEAD else f"{kind}: {reason}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "reason", reason)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a death's {name} is read-only")

    def __reduce__(self) -> tuple[type[Death], tuple[DeathKind, str]]:
        return Death, (self.kind, self.reason)

    def __copy__(self) -> Death:
        return self

    def __deepcopy__(self, memo: object) -> Death:
        return self  # immutable, as a str

    def __repr__(self) -> str:
        return f"Death({self.kind.name}, {self.reason!r})"

    @classmethod
    def dead(cls, reason: str) -> Death:
        return cls(DeathKind.DEAD, reason)

    @classmethod
    def unfit(cls, reason: str) -> Death:
        return cls(DeathKind.UNFIT, reason)

    def said(self) -> str:
        """As a tick says it: `dead (reason)`, `unfit (reason)`."""
        return f"{self.kind} ({self.reason})"


_ATOMS = frozenset({str, int, float, bool, type(None)})


class _NotJson(Exception):
    pass


def _json_copy(v: Any) -> Any:
    """`v` as `dataclasses.asdict` copies it, for JSON's own types (exactly those: a subclass,
    a tuple or anything else raises `_NotJson`)."""
    t = type(v)
    if t in _ATOMS:
        return v
    if t is list:
        return [_json_copy(x) for x in v]
    if t is dict:
        return {_json_copy(k): _json_copy(x) for k, x in v.items()}
    raise _NotJson



UNKNOWN = "?"  # a value not known: never Python's `None`, never a verdict it is not


def known(value: object) -> str:
    """A value for words or a cell: `UNKNOWN` where it is not known (None), else its text."""
    return UNKNOWN if value is None else str(value)

@dataclass
class Health:
    label: str
    provider: str
    ssh: bool = False
    agent: bool = False
    # SSH did not answer, though its sshd took the connection and the login: the command never
    # ran (a hung login). The path to the box works: a death, never the fleet's blindness
    hung: bool = False
    synced: bool | None = None
    blocks: int | None = None
    exec_tip: int | None = None
    exec_moving: bool | None = None
    prover: str | None = None
    admitted: bool | None = None
    admission_reason: str | None = None
    node_sha16: str | None = None
    wanted_sha16: str | None = None
    problems: list[str] = field(default_factory=list)
    # the p2p mesh, from a fresh node reading (None: unknown, never 0)
    peers_in: int | None = None
    peers_out: int | None = None
    peer_list: list[dict[str, Any]] = field(default_factory=list)  # {dir, remote, public}
    # fewer inbound peers than the mesh needs, one loop interval after conversion (None:
    # cannot be told yet)
    star_only: bool | None = None
    # why the box is owed a replacement that maps a p2p port (`fleet.ops.ports`); None: not
    port_owed: str | None = None
    # the disk where the agent writes, from the status: its fullest of run/ and out/ (None:
    # unknown)
    disk_free: int | None = None
    disk_total: int | None = None

    @property
    def well(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """`dataclasses.asdict` and `well`: every list and object a copy of its own. Built
        directly for the JSON a box's status gives (asdict's deep copy of each peer of each
        box was most of what saving a tick cost); any other value takes asdict's own way."""
        try:
            d = {f.name: _json_copy(getattr(self, f.name)) for f in fields(self)}
        except _NotJson:
            d = asdict(self)
        return {**d, "well": self.well}

    def peers_word(self) -> str:
        """`in/out` as a cell, `?` for a count not known, and `star-only` where the node is
        dialled by fewer peers than the mesh needs (`fleet.ops.check.star_only`), `owed a
        port` where it is owed a replacement that maps one (`fleet.ops.ports`)."""
        return f"{known(self.peers_in)}/{known(self.peers_out)}" + \
            (" star-only" if self.star_only else "") + (" owed a port" if self.port_owed else "")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Health:
        """A Health as `to_dict` wrote it. `well` is derived again from the problems, never
        read, and a field of the wrong type is a ValueError: a damaged file must never read as
        a box without problems."""
        for name in ("label", "provider", "problems", "ssh", "agent"):
            if name not in d:
                raise ValueError(f"a box's health without its {name}")
        out: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name == "problems":
                if not isinstance(v, list) or not all(isinstance(p, str) for p in v):
                    raise ValueError("a box's health: problems is not a list of texts")
                v = list(v)
            elif f.name == "peer_list":
                if not isinstance(v, list) or not all(isinstance(p, dict) for p in v):
                    raise ValueError("a box's health: peer_list is not a list of peers")
                v = [dict(p) for p in v]
            elif not isinstance(v, _HEALTH_TYPES[str(f.type)]):
                raise ValueError(f"a box's health: {f.name} is {type(v).__name__}")
            out[f.name] = v
        if not out["problems"] and not (out["ssh"] and out["agent"]):
            raise ValueError("a box's health with no problem though SSH or its agent is down")
        return cls(**out)


def mesh_summary(boxes: Sequence[tuple[str, int | None, bool | None]]) -> dict[str, Any]:
    """The p2p mesh over boxes given as (label, inbound peers, star-only): how many nodes have
    each inbound count (unknown apart), how many are known, how many of those a peer dials,
    and which are star-only."""
    degrees: dict[str, int] = {}
    for _, n, _ in boxes:
        key = "unknown" if n is None else str(n)
        degrees[key] = degrees.get(key, 0) + 1
    known = [n for _, n, _ in boxes if n is not None]
    return {"in_degrees": dict(sorted(degrees.items())), "known": len(known),
            "dialable": sum(1 for n in known if n),
            "star_only": sorted(label for label, _, star in boxes if star)}


# Health's field types (as written in its annotations) -> what from_dict accepts
_HEALTH_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,), "bool": (bool,), "bool | None": (bool, type(None)),
    "int | None": (int, type(None)), "str | None": (str, type(None)), "list[str]": (list,),
    "list[dict[str, Any]]": (list,)}


@dataclass
class Watch:
    label: str
    job: str | None
    phase: str | None
    age_min: float
    ttl_left_min: float | None
    problems: list[str] = field(default_factory=list)
    due: bool = False  # a teardown is what it needs (not the operator's eyes first)

    @property
    def well(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "well": self.well}


@dataclass
class Owed:
    """A wanted box the loop still has to rent: a roster shortfall or a dead box's re-rent.

    The loop keeps them in its memory (`fleet.state.loop_memory`) and sets `reason` at each
    try; the roster, the last tick and the page show them (`for_page`, `to_dict`)."""

    role: str
    provider: str
    card: str
    gpus: int
    since: str  # UTC ISO-8601
    reason: str = "not tried yet"
    rerent_of: str | None = None
    cloud: str | None = None  # a re-rent keeps the dead box's tier
    slot: str | None = None  # the roster slot it fills (`fleet.ops.owed`)

    def shape(self) -> tuple[str, str, str, int]:
        return (self.role, self.provider, self.card, self.gpus)

    def for_page(self) -> Owed:
        """As the page and the last tick show it: the box it replaces said in its reason."""
        why = self.reason if not self.rerent_of else f"{self.reason} (replaces {self.rerent_of})"
        return Owed(self.role, self.provider, self.card, self.gpus, self.since, why)

    def to_dict(self) -> dict[str, Any]:
        """The page's and the last tick's fields (`for_page` first to name a re-rent's box)."""
        return {"role": self.role, "provider": self.provider, "card": self.card,
                "gpus": self.gpus, "reason": self.reason, "since": self.since}
