"""What the standing roster is owed, as a pure function of the registry's rows, the re-rents
the loop remembers and fleet.toml: no provider call, no file (`fleet.ops.loop` reads them,
asks this, rents what it returns and saves the re-rents it keeps)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from fleet.core.states import BoxKind
from fleet.core.verdicts import Owed

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.core.config import Config

Shape = tuple[str, str, str, int]  # role, provider, card, GPUs


def shape_of(row: Row) -> Shape:
    return (row.role, row.provider, row.card, row.gpu_count)


def slot_name(shape: Shape, n: int) -> str:
    """The roster's `n`th place of `shape` (the database holds one live box per slot)."""
    role, provider, card, gpus = shape
    return f"{role}/{provider}/{card}/{gpus}#{n}"


def free_slots(shape: Shape, count: int, live: Sequence[Row]) -> list[str]:
    """The shape's slots no live row holds, lowest first."""
    held = {r.slot for r in live if r.slot}
    return [s for s in (slot_name(shape, n) for n in range(count)) if s not in held]


def wanted(cfg: Config) -> dict[Shape, int]:
    """The roster's count of each shape."""
    return {(w.role, w.provider, w.card, w.gpus): w.count for w in cfg.roster}


def owed(cfg: Config, rows: Sequence[Row], rerents: Sequence[Owed], before: Sequence[Owed],
         now: str) -> tuple[list[Owed], list[Owed]]:
    """(the re-rents still owed, to remember; everything owed now: those re-rents first, then
    each roster entry's shortfall, a pending re-rent filling one).

    A re-rent is owed only while no live row replaces its box (`rerent_of`, or a move of it,
    `move_of`), so a loop killed between a rent and saving its memory never rents the
    replacement twice; and only while its roster entry is short (a box adopted from a
    registry behind the account may already fill the place: never rent past the roster). A
    re-rent of a role fleet.toml no longer has is kept, never rented (a standing box rented
    by hand, in a shape no roster entry names, is kept up like the roster's). Unfinished
    rents count: each tick resumes them, each with its own deadline. `before`: what the last
    tick owed (a shortfall keeps the time it was first owed)."""
    live = [r for r in rows if r.live and not r.destroy_wanted]
    replaced = {r.rerent_of for r in live if r.rerent_of} | {r.move_of for r in live if r.move_of}
    kept = [o for o in rerents if o.rerent_of not in replaced]
    counts = wanted(cfg)
    have_of = Counter(shape_of(r) for r in live)
    have_count = Counter(have_of)
    for o in list(kept):
        if o.shape() in counts and have_of[o.shape()] >= counts[o.shape()]:
            kept.remove(o)
        elif o.shape() in counts:
            have_of[o.shape()] += 1  # the next re-rent of the shape counts this one
    out = [o for o in kept if o.role in cfg.roles]
    since = {(o.shape(), o.rerent_of): o.since for o in before}
    free = {shape: free_slots(shape, n, live) for shape, n in counts.items()}
    for o in out:  # a re-rent fills its dead box's slot where it is free, else the first free
        spare = free.get(o.shape(), [])
        if o.slot not in spare:
            o.slot = spare[0] if spare else None
        if o.slot in spare:
            spare.remove(o.slot)
    for w in cfg.roster:
        if cfg.role(w.role).kind != BoxKind.STANDING:
            continue  # one-shot boxes are rented per job (`fleet run`), never kept up
        shape = (w.role, w.provider, w.card, w.gpus)
        have = have_count[shape]
        pending = sum(1 for o in out if o.shape() == shape and o.rerent_of)
        spare = free.get(shape, [])
        for i in range(max(0, w.count - have - pending)):
            out.append(Owed(*shape, since=since.get((shape, None), now),
                           slot=spare[i] if i < len(spare) else None))
    return kept, out
