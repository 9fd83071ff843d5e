"""Step 6 of a tick: orphans reported, and swept after their grace only where their label
has the fleet's exact form and the registry is provably not behind."""

from __future__ import annotations

import time

from fleet.core.errors import FleetError, NotLeader, UsageError
from fleet.core.states import DOWN
from fleet.core.times import now_iso
from fleet.ops import destroy, sweep
from fleet.ops.loop.base import LoopBase, Tick, epoch
from fleet.providers.sync import View
from fleet.state.loop_memory import Memory


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
        now = time.time()
        seen = {}
        grace = self.cfg.loop.orphan_grace_s
        rows = self.reg.rows()
        found = sweep.orphans(v.orphans, rows, self._form(), tuple(self.cfg.roles),
                              v.duplicates, self._adopted)
        for o in found:
            t.orphans.append(f"{o.box.label} ({o.key})")
            if not o.ours:
                self._act(t, f"orphan {o.box.label} ({o.key}, {o.box.rate()}): {o.what}; "
                             "its label is not of this fleet's form, so it is never destroyed")
                continue
            seen[o.key] = mem.orphans.get(o.key, now_iso())
        refusal = sweep.refusal(found, rows)
        for b, key, what in ((o.box, o.key, o.what) for o in found if o.ours):
            age = now - epoch(seen[key])
            if age < grace or not self.destroy_orphans or refusal:
                left = "" if not self.destroy_orphans else (
                    f", destroyed in {grace - age:.0f} s" if not refusal else
                    f"; no orphan is destroyed: {refusal}")
                self._act(t, f"orphan {b.label} ({key}, {b.rate()}): {what}"
                             f"{left}")
                continue
            spend = self._spender(t, mem, f"orphan {b.label} ({key})", what,
                                  judged=b.status not in DOWN)
            order = destroy.Order(b.label, box_id=b.box_id, judged=True)
            try:  # its row read again under the lock: a rent may have just written it
                if destroy.destroy(self.cfg, self.reg, self.providers, order,
                                   spend=spend) is None:
                    continue
            except NotLeader:
                raise
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
