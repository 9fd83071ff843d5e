"""Which boxes on the account are orphans, and whether the sweep may destroy any this tick, as
pure functions of the tick's listing and the registry's rows.

No provider call, no file: `fleet.ops.loop.orphans` reports what `orphans` finds, waits out
each one's grace, and destroys through the one destroy path only while `refusal` is None.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from fleet.core import labels
from fleet.core.boxes import Row
from fleet.ops import judgement
from fleet.providers.base import Box


@dataclass(frozen=True)
class Orphan:
    box: Box
    what: str  # why it is an orphan
    ours: bool  # its label has the fleet's exact form: the only kind ever swept

    @property
    def key(self) -> str:
        return f"{self.box.provider}/{self.box.box_id}"


def orphans(boxes: Sequence[Box], rows: Sequence[Row], form: re.Pattern[str],
            roles: Sequence[str], duplicates: Collection[str],
            adopted: Collection[str]) -> list[Orphan]:
    """The boxes the registry does not own (`boxes`: those the listing matched to no row's
    box) that are the fleet's business: under one of its roles' names, or a second box under
    a live row's label (`duplicates`: "provider/id"), or under a label whose row was given up
    or destroyed. Another fleet's or a person's box under no role of ours is none of them;
    nor is one `adopted` this tick (its row was just written)."""
    given_up = {r.label for r in rows if not r.live}
    out = []
    for b in boxes:
        label, key = b.label or "", f"{b.provider}/{b.box_id}"
        if key in adopted:
            continue
        if not (form.match(label) or labels.role_prefixed(label, tuple(roles))
                or key in duplicates or label in given_up):
            continue
        what = "a second box under a live label" if key in duplicates else \
            "its rent was given up or its box destroyed" if label in given_up else \
            "not in the registry"
        out.append(Orphan(b, what, ours=form.match(label) is not None))
    return out


def refusal(found: Sequence[Orphan], rows: Sequence[Row]) -> str | None:
    """Why no orphan may be destroyed this tick (`judgement.sweep_refusal`), or None: counted
    over the orphans of the fleet's own form."""
    ours = [o for o in found if o.ours]
    recorded = {r.label for r in rows}
    return judgement.sweep_refusal(sum(1 for r in rows if r.live), len(ours),
                                   sorted(o.box.label for o in ours
                                          if o.box.label not in recorded))
