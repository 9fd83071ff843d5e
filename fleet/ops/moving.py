"""What a running move does this tick, as a pure function of what the tick saw: finish it
(the old box may go), give it up (its new box goes, the old one stays), or wait.

No provider call, no SSH command, no file: `fleet.ops.loop.moves` gathers the rows and the
checks, asks `step`, and acts on (and says) what it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fleet.core.boxes import Row


@dataclass(frozen=True)
class Step:
    do: Literal["finish", "abandon", "wait"]
    why: str = ""  # for "abandon": why it is given up; for "wait": what it waits on


def step(new: Row, old: Row, *, done: bool, checked: bool, ported: str | None,
         old_owes_no_port: bool, crowd: list[str], age: float, timeout: float) -> Step:
    """The step of the move from `old` to `new` this tick.

    `done`: `new` was checked well and synced this tick; `checked`: it was checked at all (a
    blind tick gives no move up on its deadline); `ported`: what `new` still lacks for the
    mesh (a mapped p2p port, its inbound peers; None: nothing, or no p2p role for a place
    move); `old_owes_no_port`: a fresh, passing check of `old` proves its port works after
    all; `crowd`: the role's other boxes on `new`'s place; `age`: seconds since `new`'s rent.
    A port move finishes once `new` is done and ported, and is given up when `old` owes no
    port any more. A place move is given up when `new` landed on a held place (or one its
    provider does not name), and finishes once done (and ported, for a p2p role). Either is
    given up past `timeout` on a tick that checked `new`."""
    if new.move_for == "port":
        if old_owes_no_port:  # a mapping listed late, a passing verdict: old is well again
            return Step("abandon", f"{old.label} owes no port any more")
        overdue, waiting = "not done", "not yet well and synced"
    else:
        if not new.place or crowd:
            where = new.place or "a place its provider does not name"
            held_by = f", held by {', '.join(crowd)}" if crowd else ""
            return Step("abandon", f"it landed on {where}{held_by}")
        overdue, waiting = "not well and synced", ""
    if done and ported is None:
        return Step("finish")
    if age > timeout and checked:
        return Step("abandon", f"{overdue} {age:.0f} s after its rent (move_timeout_s "
                               f"{timeout:.0f})")
    return Step("wait", ported or waiting)
