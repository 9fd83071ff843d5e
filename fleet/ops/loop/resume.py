"""Step 2 of a tick: the rents that never finished resumed or given up at their deadline;
boxes of the fleet's form the registry is behind on adopted; a vanished box listed again
revived."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from fleet.boxes import lifecycle
from fleet.boxes.sshkeys import write_known_hosts
from fleet.core import labels
from fleet.core.boxes import Row, is_standing, unfinished
from fleet.core.errors import FleetError, NotLeader
from fleet.core.states import DOWN, BoxStatus
from fleet.core.times import now_iso
from fleet.ops import destroy
from fleet.ops import owed as owed_mod
from fleet.ops.loop.base import Late, LoopBase, Tick, epoch
from fleet.providers.base import Box
from fleet.providers.sync import View
from fleet.state.loop_memory import Memory

if TYPE_CHECKING:
    from fleet.providers.base import Provider


class Resuming(LoopBase):
    def _adopt_unrecorded(self, t: Tick, v: View, failed: set[str]) -> None:
        """Write a row for each box of this fleet's exact form (its fleet id) that the
        registry has none for. Every rent writes its row before its create, so such a box
        means the registry is behind the account (restored from an older copy): the row
        makes it an unfinished rent, resumed, pinned and converted like one, and the roster
        counts it, so the roster is not rented twice. Never while the registry holds no live
        row (the sweep's own refusal), nor for a second box under a label that has a row."""
        form = self._form()
        rows = self.reg.rows()
        if not any(r.live for r in rows):
            return
        recorded = {r.label for r in rows}
        for b in v.orphans:
            key = f"{b.provider}/{b.box_id}"
            if b.provider in failed or b.label in recorded or not form.match(b.label) \
                    or key in v.duplicates:
                continue
            price = b.usd_per_hour if b.priced else max(
                (r.usd_per_hour for r in rows if (r.provider, r.card, r.gpu_count)
                 == (b.provider, b.card, b.gpu_count)), default=None)
            if price is None:  # never a $0 row: the budget refuses rents while it is listed
                self._act(t, f"{b.label} ({key}): a box of this fleet's own form the registry "
                             f"has no row for, and {b.provider} lists no price for it: not "
                             "adopted (no price of its shape is known)")
                continue
            role = self._role_of(b.label)
            rerent_of, move_of = _replaced_by(b.label, rows, v)
            self.reg.add(Row(label=b.label, provider=b.provider, role=role,
                             kind=self.cfg.roles[role].kind, card=b.card,
                             gpu_count=b.gpu_count, usd_per_hour=price,
                             status=b.status, provider_id=b.box_id, place=b.place,
                             created_at=now_iso(), rerent_of=rerent_of, move_of=move_of,
                             move_for="place" if move_of else None,
                             note="adopted: the registry had no row for this box of the "
                                  "fleet's own form (it was behind the account)"))
            recorded.add(b.label)
            self._adopted.add(key)
            self._act(t, f"{b.label} ({key}): adopted: a box of this fleet's own form the "
                         "registry had no row for (it is behind the account: restored from "
                         "an older copy?); resumed as an unfinished rent")

    def _revive_vanished(self, t: Tick, mem: Memory, v: View, failed: set[str]) -> None:
        """A box its row calls vanished (its provider said it had no box of that id, and SSH
        did not answer; the fleet never destroyed it) listed running again under its own label
        and id: the provider's word was wrong, the box is the fleet's, and its row is live
        again, while its roster entry is short (else it is an orphan, swept within the
        disruption budget). A healthy box is never swept for the provider's passing
        blindness."""
        rows = {r.label: r for r in self.reg.rows()}
        live = [r for r in rows.values() if r.live]
        for b in v.orphans:
            row = rows.get(b.label)
            key = f"{b.provider}/{b.box_id}"
            if row is None or row.status != BoxStatus.VANISHED or b.provider in failed \
                    or (row.provider, row.provider_id) != (b.provider, b.box_id) \
                    or key in v.duplicates or b.status != BoxStatus.RUNNING:
                continue  # one still restarting is revived once it runs
            shape = owed_mod.shape_of(row)
            # a re-rent of it not yet converted does not fill its place: the box that is back
            # runs already, and the re-rent is given up below
            pending = [r for r in live if r.rerent_of == row.label and unfinished(r)]
            if sum(1 for r in live if owed_mod.shape_of(r) == shape and r not in pending) \
                    >= owed_mod.wanted(self.cfg).get(shape, 0):
                continue
            back = {"status": b.status, "destroyed_at": None,
                    "note": f"back: {row.provider} lists box {b.box_id} again after calling "
                            "it gone"}
            holder = next((r for r in live if row.slot and r.slot == row.slot), None)
            changes: dict[str, dict[str, object]] = {}
            if holder is not None and holder in pending:  # given up below: the slot is back's
                changes[holder.label] = {"slot": None}
            elif holder is not None:  # a box of its own holds it: back fills no slot
                back["slot"] = None
            self.reg.update_many(changes | {row.label: back})
            # nothing was lost: its vanishing spends no disruption budget, and a death of
            # it from now on is a new one, never the retry of an old destroy
            mem.disruptions = [r for r in mem.disruptions if r.get("label") != row.label]
            live.append(row)
            self._adopted.add(key)
            self._act(t, f"{row.label} ({key}): listed again after {row.provider} said it "
                         "had no such box: the fleet's own, live again (never swept)")
        self._give_up_rerents_of_live(t, v, failed)

    def _give_up_rerents_of_live(self, t: Tick, v: View, failed: set[str]) -> None:
        """Give up every re-rent not yet converted whose box to replace is live and listed
        running (it came back): its rent's own undo, tried each tick until it is done (one
        box more than the roster wants would bill for ever otherwise)."""
        rows = {r.label: r for r in self.reg.rows()}
        running = {row.label for row, box in v.matched if box.status == BoxStatus.RUNNING}
        running |= {r.label for r in rows.values() if r.live and r.provider_id
                    and f"{r.provider}/{r.provider_id}" in self._adopted}  # back this tick
        for r in rows.values():
            back = rows.get(r.rerent_of or "")
            if not (r.live and unfinished(r) and back is not None and back.live
                    and back.label in running) or r.label in self._unsure \
                    or r.provider in failed:
                continue
            why = f"{back.label}, which it was to replace, is back"
            order = destroy.Order(r.label, seen_id=r.provider_id, force=True,
                                  also={"note": f"re-rent given up: {why}"})
            if self._destroy(t, order, f"the re-rent ({why})") is not None:
                self._act(t, f"{r.label}: destroyed: re-rent given up ({why})")

    def _resume_unfinished(self, t: Tick, v: View,
                           failed: set[str]) -> tuple[list[str], list[Late]]:
        """Take up every standing rent that never finished (its box not SSH-ready in time, or
        the rent killed half-way), each against its own deadline from its row's creation
        (`[loop] ready_timeout_s`). Returns the labels whose host key was pinned now, to be
        converted this tick, and the boxes to give up (`_give_up`, once the checks have said
        whether the fleet's own SSH works this tick).

        + no box found: a row without a box id is looked up by its label (a create whose
          outcome was unknown may have landed); past the deadline the row is marked failed
          (vanished, where it had a box: what that box spent still counts, unless its
          provider's listing left out most of its boxes at once, `_gap`), and the roster
          rents anew
        + a box found is recorded; one that is SSH-ready has its host key pinned
        + a box its provider lists exited before it was ever ready is given up at once; one
          still not ready past the deadline is given up then
        + a row under a label not of the fleet's form (a hand-given one, or an older loop's
          `-r<n>` of one) is never resumed onto a box found by label (`_hand_labelled`)
        A provider that does not answer leaves its rows as they are."""
        listed = {row.label: box for row, box in v.matched}
        form = self._form()
        pinned: list[str] = []
        late: list[Late] = []
        now = time.time()
        for row in self.reg.rows():
            if not (unfinished(row) and is_standing(self.cfg, row)) or row.provider in failed:
                continue
            p = self.providers.get(row.provider)
            if p is None or row.label in v.unsure:
                continue
            age = now - epoch(row.created_at) if row.created_at else 0.0
            try:
                if not row.provider_id and not form.match(row.label):
                    self._hand_labelled(t, v, p, row, age)
                    continue
                box = listed.get(row.label) or lifecycle.find_unfinished(p, row)
                if box is None:
                    self._no_box(t, v, row, age)
                    continue
                row = lifecycle.record(self.reg, row.label, box)
                if self._pinned(t, row, box):
                    pinned.append(row.label)
                else:
                    late.extend(self._not_ready(t, row, box, age))
            except NotLeader:
                raise
            except FleetError as e:
                self._act(t, f"{row.label}: resuming the unfinished rent failed ({e}); tried "
                             "again next tick")
        if pinned:
            write_known_hosts(self.cfg.known_hosts, self.reg.rows())
        return pinned, late

    def _no_box(self, t: Tick, v: View, row: Row, age: float) -> None:
        """An unfinished rent with no box found: given up past its deadline (`_never_landed`),
        unless its provider's listing left out many of its boxes at once (`_gap`)."""
        if age <= self.cfg.loop.ready_timeout_s:
            return
        gap = self._gap(v, row.provider) if row.provider_id else None
        if gap:
            self._act(t, f"{row.label}: {row.provider} has no box {row.provider_id} by id, "
                         f"but its listing left out {gap} at once: kept, not given up this tick")
        else:
            self._never_landed(t, row, age)

    def _pinned(self, t: Tick, row: Row, box: Box) -> bool:
        """Pin the host key of the box an unfinished rent found (recorded on its row), where
        it is SSH-ready: whether it was pinned now."""
        key = lifecycle.host_key_if_ready(box)
        if key is None:
            if box.ssh_ready:  # ready by its provider, unreached by SSH
                self._unreached.add(row.label)
            return False
        lifecycle.pin(self.reg, row, key)
        self._act(t, f"{row.label}: unfinished rent resumed: SSH-ready, host key pinned")
        return True

    def _not_ready(self, t: Tick, row: Row, box: Box, age: float) -> list[Late]:
        """An unfinished rent's box not SSH-ready: given up at once where its provider lists
        it exited, else at its deadline; said while it waits."""
        limit = self.cfg.loop.ready_timeout_s
        if box.status == BoxStatus.EXITED:
            return [Late(row, box, f"{row.provider} lists it exited before it was ever "
                                   "SSH-ready", sight=False)]
        if age > limit:
            # a box its provider says is ready, whose SSH the fleet cannot reach, is given up
            # only where the fleet's own SSH provably works (`_give_up`), until three
            # deadlines have passed: then it is never kept billing
            return [Late(row, box, f"not SSH-ready {age:.0f} s after the rent "
                                   f"(ready_timeout_s {limit:.0f}, {box.status})",
                         sight=box.ssh_ready and age <= 3 * limit)]
        self._act(t, f"{row.label}: waiting for SSH ({box.status}, {age:.0f} s of "
                     f"{limit:.0f})")
        return []

    def _hand_labelled(self, t: Tick, v: View, p: Provider, row: Row, age: float) -> None:
        """An unfinished rent under a hand-given label that never learnt its box's id. Found
        by label alone, a box under it may be a person's: never adopted or destroyed here
        (`fleet rent ROLE --label LABEL` resumes it). Past its deadline with no box under its
        label (the listing, then the provider asked again, and no listing gap: `_gap`) it
        never landed: given up, and its roster place rented anew."""
        limit = self.cfg.loop.ready_timeout_s
        resume = f"`fleet rent {row.role} --label {row.label}` resumes it"
        box = next(iter(_under_label(v, row)), None)
        if box is None and age > limit:
            box = p.find_by_label(row.label)
        gap = self._gap(v, row.provider) if box is None and age > limit else None
        if box is not None:
            self._act(t, f"{row.label}: an unfinished rent under a hand-given label; "
                         f"{row.provider} lists box {box.box_id} under it, never adopted or "
                         f"destroyed by the loop (it may be a person's): {resume}")
        elif age <= limit:
            self._act(t, f"{row.label}: an unfinished rent under a hand-given label, no box "
                         f"under it yet: {resume}; given up in {limit - age:.0f} s")
        elif gap:
            self._act(t, f"{row.label}: no box under its hand-given label at {row.provider}, "
                         f"but its listing left out {gap} at once: kept, not given up this "
                         "tick")
        else:
            self._never_landed(t, row, age)

    def _never_landed(self, t: Tick, row: Row, age: float) -> None:
        if row.provider_id:  # it had a box, which its provider no longer has
            self.reg.mark_destroyed(row.label, BoxStatus.VANISHED)
            self._act(t, f"{row.label}: unfinished rent given up: {row.provider} has no box "
                         f"{row.provider_id} any more")
            return
        self.reg.update(row.label, status=BoxStatus.FAILED, destroyed_at=now_iso(),
                        note=f"no box under its label {age:.0f} s after the rent: it never "
                             "landed")
        self._act(t, f"{row.label}: unfinished rent given up (no box under its label after "
                     f"{age:.0f} s)")

    def _give_up(self, t: Tick, mem: Memory, late: list[Late], sees: set[str]) -> None:
        """Destroy the unfinished rents' boxes given up this tick; `sees`: the providers whose
        boxes answered the fleet's SSH this tick with no breaker open (else a box the provider
        calls ready but that never answered may be the fleet's own blindness: kept, and
        said). The machine of a box its provider lists exited before it was ever ready is
        passed over like an unfit one (`UNFIT_MACHINE_S`): its container does not start
        there, and the next rent must not land on it again."""
        for g in late:
            if g.sight and g.row.provider not in sees:
                self._act(t, f"{g.row.label}: {g.why}; kept: no box of {g.row.provider} "
                             "answered the fleet's SSH this tick with its breaker closed, so it "
                             "cannot tell the box from its own blindness")
                continue
            # never converted: its rent's own undo (no standing node, no job's outputs); but a
            # box adopted from the account (a registry behind it) may be a converted node: a
            # judgement within the disruption budget
            adopted = (g.row.note or "").startswith("adopted")
            order = destroy.Order(g.row.label, seen_id=g.row.provider_id, force=not adopted,
                                  judged=adopted, also={"note": f"{g.why}: destroyed"})
            spend = self._spender(t, mem, g.row.label, g.why,
                                  judged=g.box.status not in DOWN) if adopted else None
            if self._destroy(t, order, f"it ({g.why})", spend) is None:
                continue
            self._act(t, f"{g.row.label}: destroyed: {g.why}")
            if g.box.status == BoxStatus.EXITED and g.box.machine_id:
                mem.unfit_machines[f"{g.row.provider}/{g.box.machine_id}"] = now_iso()


def _under_label(v: View, row: Row) -> list[Box]:
    """The boxes `row`'s provider listed this tick under its label, its own first."""
    own = [b for r, b in v.matched if r.label == row.label]
    return own + [b for b in v.orphans if b.label == row.label and b.provider == row.provider]


def _replaced_by(label: str, rows: list[Row], v: View) -> tuple[str | None, str | None]:
    """What an adopted `<base>-r<n>` box took over from, as its rent would have recorded it
    (rerent_of, move_of): the newest box of its chain (`base`, `base-r1`, ...) that is live
    and listed, moved (a move keeps its old box until done); else the newest of the chain,
    re-rented (so it is not re-rented a second time)."""
    chain = [r for r in rows if r.label != label and labels.is_rerent_label(label, r.label)]
    if not chain:
        return None, None
    listed = {row.label for row, _ in v.matched}
    standing = [r for r in chain if r.live and r.label in listed]
    if standing:
        return None, max(standing, key=lambda r: r.created_at).label
    return max(chain, key=lambda r: r.created_at).label, None
