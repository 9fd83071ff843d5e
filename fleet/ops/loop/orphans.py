"""Step 6 of a tick: orphans reported, and swept after their grace only where their label
has the fleet's exact form and the registry is provably not behind."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleet.core import labels
from fleet.core.errors import (
    FleetError,
    UsageError,
)
from fleet.core.times import now_iso
from fleet.ops import destroy, disruption, judgement
from fleet.ops.loop.base import (
    LoopBase,
    Tick,
    epoch,
)
from fleet.providers.sync import View
from fleet.state.loop_memory import Memory

if TYPE_CHECKING:
    pass


class Sweeping(LoopBase):
    def _orphans(self, t: Tick, mem: Memory, v: View, failed: set[str]) -> None:
        """Report every box of the fleet's roles the registry does not own, and every second
        box under a live row's label, and destroy, once seen for the grace, only those whose
        label has this fleet's exact form (its fleet id: `fleet.core.labels`) and whose rent
        the registry recorded (a row under the label: the rent was given up or its box
        destroyed, yet a box landed; or a live row whose box is another). Nothing is destroyed
        while the registry has no live row (a missing or mistyped registry path reads as
        empty), while the orphans outnumber the live rows, or while one of them carries a
        label the registry never recorded: every rent writes its row before the create, so
        the registry is behind (restored from an older copy, or another copy of it rents).
        Each destroy first reads the label's row again under the registry's lock."""
        roles = tuple(self.cfg.roles)
        form = self._form()
        now = time.time()
        seen = {}
        grace = self.cfg.loop.orphan_grace_s
        ours = []
        rows = self.reg.rows()
        given_up = {r.label for r in rows if not r.live}
        for b in v.orphans:
            label = b.label or ""
            key = f"{b.provider}/{b.box_id}"
            if key in self._adopted:
                continue  # no orphan any more: its row was written this tick
            if not (form.match(label) or labels.role_prefixed(label, roles)
                    or key in v.duplicates or label in given_up):
                continue  # another fleet's or a person's box, under no role of ours
            what = "a second box under a live label" if key in v.duplicates else \
                "its rent was given up or its box destroyed" if label in given_up else \
                "not in the registry"
            t.orphans.append(f"{b.label} ({key})")
            if not form.match(label):
                self._act(t, f"orphan {b.label} ({key}, {b.rate()}): {what}; "
                             "its label is not of this fleet's form, so it is never destroyed")
                continue
            seen[key] = mem.orphans.get(key, now_iso())
            ours.append((b, key, what))
        live = [r for r in rows if r.live]
        recorded = {r.label for r in rows}
        unrecorded = sorted(b.label for b, _, _ in ours if b.label not in recorded)
        refusal = judgement.sweep_refusal(len(live), len(ours), unrecorded)
        for b, key, what in ours:
            age = now - epoch(seen[key])
            if age < grace or not self.destroy_orphans or refusal:
                left = "" if not self.destroy_orphans else (
                    f", destroyed in {grace - age:.0f} s" if not refusal else
                    f"; no orphan is destroyed: {refusal}")
                self._act(t, f"orphan {b.label} ({key}, {b.rate()}): {what}"
                             f"{left}")
                continue
            spend = self._spender(t, mem, f"orphan {b.label} ({key})", what,
                                  judged=b.status not in disruption.REPORTED_DOWN)
            order = destroy.Order(b.label, box_id=b.box_id, judged=True)
            try:  # its row read again under the lock: a rent may have just written it
                if destroy.destroy(self.cfg, self.reg, self.providers, order,
                                   spend=spend) is None:
                    continue
            except UsageError as e:  # a guard refused (`destroy.Refused`), or no API key
                self._act(t, f"orphan {b.label} ({key}): kept: {e}")
                seen.pop(key)
                continue
            except FleetError as e:
                self._act(t, f"orphan {b.label} ({key}): destroy failed ({e})")
                continue
            seen.pop(key)
            self._act(t, f"orphan {b.label} ({key}): destroyed after {age:.0f} s")
        # a provider that did not answer keeps its orphans' first-seen times
        mem.orphans = seen | {k: v for k, v in mem.orphans.items()
                              if k.split("/", 1)[0] in failed}
