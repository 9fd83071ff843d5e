"""Destroys what is dead on `dead_checks` ticks in a row (within the disruption budget
where the judgement is the loop's own) and owes its re-rent; and the boxes a rent wanted
gone."""

from __future__ import annotations

from fleet.core.boxes import is_standing
from fleet.core.states import DOWN, BoxStatus, DeathKind
from fleet.core.times import now_iso
from fleet.core.verdicts import Owed
from fleet.ops import destroy
from fleet.ops.loop.base import LoopBase, Tick
from fleet.providers.sync import View
from fleet.state.loop_memory import Memory


class Replacing(LoopBase):
    def _replace_dead(self, t: Tick, mem: Memory, v: View) -> None:
        """Destroy what is dead on `dead_checks` ticks in a row, this one included: a box not
        judged this tick (its provider silent, the breaker open) keeps its count, untouched.
        Only a box its provider says it has no more is marked vanished without a destroy."""
        listed = {row.label: box for row, box in v.matched}
        gone = {r.label for r in v.gone}
        for label, count in sorted(mem.dead.items()):
            if count < self.cfg.loop.dead_checks or label not in t.dead:
                continue
            if label not in listed and label not in gone:
                continue
            row = self.reg.get(label)
            if row is None or not row.live:
                del mem.dead[label]
                continue
            box = listed.get(label)
            if box is not None:
                # a box its provider reports down loses nothing alive: never held, counted
                held = box.status not in DOWN
                spend = self._spender(t, mem, label, str(t.dead[label]), judged=held)
                if self._destroy(t, destroy.Order(label, seen_id=box.box_id, judged=True),
                                 "the dead box", spend) is None:
                    continue
                self._act(t, f"{label}: destroyed (dead or unfit on {count} checks)")
            else:
                if self._spend(t, mem, row.role, label, str(t.dead[label]),
                               judged=False) is None:
                    continue
                self.reg.mark_destroyed(label, BoxStatus.VANISHED)
                self._act(t, f"{label}: marked vanished (no provider lists it)")
            del mem.dead[label]
            if t.dead[label].kind is DeathKind.UNFIT and box is not None and box.machine_id:
                mem.unfit_machines[f"{row.provider}/{box.machine_id}"] = now_iso()
            moved = self.reg.get(row.move_of) if row.move_of else None
            if moved is not None and moved.live:
                self._act(t, f"{label}: it was moving {moved.label}, which stays: no re-rent "
                             "owed")
            elif moved is not None and any(o.rerent_of == moved.label for o in mem.rerents):
                self._act(t, f"{label}: it was moving {moved.label}, which died too: one "
                             "re-rent owed for both")
            elif is_standing(self.cfg, row):
                mem.rerents.append(Owed(row.role, row.provider, row.card, row.gpu_count,
                                       now_iso(), rerent_of=label, cloud=row.cloud,
                                       slot=row.slot))

    def _destroy_wanted(self, t: Tick, v: View, failed: set[str]) -> None:
        """Destroy the boxes a rent wanted gone but could not destroy (over budget at the
        price listed after the create): never adopted, resumed or counted for the roster,
        and counted by the budget until they are gone. One whose provider has no such box
        any more, while its listing shows the fleet's other boxes (the key sees the fleet's
        account), is marked destroyed: its terminate went through after all."""
        seeing = {row.provider for row, _ in v.matched}
        gone = {r.label for r in v.gone}
        for row in self.reg.rows():
            if not row.live or not row.destroy_wanted or row.provider in failed:
                continue
            p = self.providers.get(row.provider)
            if p is None:
                continue
            if row.label in gone and row.provider in seeing and self._gap(v, row.provider) is None:
                self.reg.update(row.label, status=BoxStatus.DESTROYED, destroyed_at=now_iso())
                self._act(t, f"{row.label}: destroyed ({row.destroy_wanted}): {row.provider} "
                             f"has no box {row.provider_id} any more (asked by id)")
                continue
            # by its id (the client tells a box gone from one its key cannot see), else every
            # box under its label
            order = destroy.Order(row.label, seen_id=row.provider_id, force=True)
            if self._destroy(t, order, f"it ({row.destroy_wanted})") is None:
                continue
            self._act(t, f"{row.label}: destroyed ({row.destroy_wanted})")
