"""Moves: a box sharing its place (a spreading role) or owed a p2p port is replaced by one
rented elsewhere, and destroyed only once that one is checked well, synced and dialled."""

from __future__ import annotations

import time
from collections.abc import Mapping

from fleet.core.boxes import Row, unfinished
from fleet.core.config import Role
from fleet.core.errors import BudgetExceeded, ProviderError, UsageError
from fleet.core.verdicts import Health
from fleet.ops import moving, ports, spread
from fleet.ops import offers as offers_mod
from fleet.ops import rent as rent_mod
from fleet.ops.check import MESH_IN
from fleet.ops.loop.base import MOVE_COOLDOWN_S, MOVE_TRIES, LoopBase, Tick, epoch, peers_sig
from fleet.state.loop_memory import Memory


class Moving(LoopBase):
    def _finish_moves(self, t: Tick, mem: Memory, health: list[Health],
                      failed: set[str]) -> None:
        """Destroy each box a move has taken over from, once the box it moved to is checked
        well and synced this tick: on a place no other box of the role holds (a move for the
        place), or with a mapped p2p port that enough of its mates dial (a move for a port,
        `_ported`); until then both run (and bill: the move's rent was checked against the
        budget with both). A move is given up (its new box destroyed, the old one kept) when
        the new box landed on a held place (for the place), when the old box owes no port
        any more (for a port), or when a tick that checked the new box finds it not done
        `[loop] move_timeout_s` after its rent."""
        checks = {h.label: h for h in health}
        done = {h.label for h in health if h.well and h.synced is not False}
        rows = {r.label: r for r in self.reg.rows()}
        for new in rows.values():
            old = rows.get(new.move_of or "")
            if not new.live or old is None or not old.live or unfinished(new):
                continue
            others = spread.holders(rows.values(), new.role, but=old.label)
            role = self.cfg.roles.get(new.role)
            # a p2p role's move keeps its mesh: the new box mapped and dialled like a port's
            p2p = new.move_for == "port" or (role is not None and role.p2p_port is not None)
            s = moving.step(new, old, done=new.label in done, checked=new.label in checks,
                            ported=self._ported(new, checks.get(new.label)) if p2p else None,
                            old_owes_no_port=new.move_for == "port"
                            and _owes_no_port(checks.get(old.label)),
                            crowd=[lb for lb in others.get(new.place or "", [])
                                   if lb != new.label],
                            age=time.time() - epoch(new.created_at) if new.created_at else 0.0,
                            timeout=self.cfg.loop.move_timeout_s)
            if s.do == "abandon":
                self._abandon_move(t, new, old, failed, s.why)
            elif s.do == "wait" and new.move_for == "port":
                self._act(t, f"{old.label}: kept until {new.label} is checked well, synced "
                             f"and dialled ({s.why})")
            elif s.do == "wait":
                self._act(t, f"{old.label}: moving to {new.label} ({new.place}); kept "
                             f"until {new.label} is checked well and synced"
                             + (f" and dialled ({s.why})" if s.why else ""))
            elif new.move_for == "port":
                if self._destroy_judged(t, mem, old, failed,
                                        f"replaced by {new.label} for a port"):
                    self.reg.update(old.label, note=f"replaced by {new.label}, which maps "
                                                    f"a p2p port {new.public_ip}:"
                                                    f"{new.p2p_public_port}")
                    self._take_slot(new, old)
                    self._act(t, f"{old.label}: destroyed: replaced by {new.label} for a "
                                 "port, checked well, synced and dialled")
            elif self._destroy_judged(t, mem, old, failed, f"moved to {new.label}"):
                self.reg.update(old.label, note=f"moved to {new.label} ({new.place}), off "
                                                f"{old.place}")
                self._take_slot(new, old)
                self._act(t, f"{old.label}: destroyed: moved to {new.label} on {new.place}, "
                             "checked well and synced")

    def _take_slot(self, new: Row, old: Row) -> None:
        """The box a move rented fills the slot of the one it replaced, now destroyed."""
        if old.slot and not new.slot:
            self.reg.update(new.label, slot=old.slot)

    def _ported(self, new: Row, h: Health | None) -> str | None:
        """What a box rented for a port still lacks before its old box may go: a mapped p2p
        port, and as many inbound peers as the mesh needs, min(MESH_IN, its mates); None when
        it has both (its being well and synced is the caller's)."""
        if not (new.public_ip and new.p2p_public_port):
            return "no mapped p2p port listed yet"
        mates = len([r for r in self._by_network().get(self.cfg.network_of(new.role), [])
                     if r.label != new.label])
        need = min(MESH_IN, mates)
        if h is None or h.peers_in is None:
            return "its inbound peers not read yet"
        if h.peers_in < need:
            return f"{h.peers_in} inbound peers of {need}"
        return None

    def _abandon_move(self, t: Tick, new: Row, old: Row, failed: set[str], why: str) -> None:
        """Give a move up: its new box is destroyed, the old one stays as it is."""
        if self._destroy_row(t, new, failed, f"the move of {old.label}"):
            self.reg.update(new.label, note=f"move of {old.label} given up: {why}")
            self._act(t, f"{new.label}: destroyed: the move of {old.label} given up ({why}); "
                         f"{old.label} stays")

    def _start_moves(self, t: Tick, mem: Memory, failed: set[str],
                     health: list[Health]) -> list[str]:
        """For each role that owes no box this tick, one move at a time: first its oldest box
        owed a port (`fleet.ops.ports`), to an offer in its shape (provider, card, GPU count)
        that maps one; else its oldest crowded box (one sharing its place with an older box
        of a spreading role), to a place the role does not hold in the same shape and tier.
        Each within the budget. Every box owed a port is said, each tick, with what keeps it
        waiting. Returns the labels rented, to be converted this tick."""
        rows = self.reg.rows()
        by_label = {r.label: r for r in rows}
        # a move runs while its new box and its old box both live
        moves = {r.move_of: r.label for r in rows if r.live and r.move_of
                 and (old := by_label.get(r.move_of)) is not None and old.live}
        owing = {o.role for o in t.owed}
        # checked before this tick's destroys: a box destroyed since (one a move replaced) is
        # owed nothing
        # an undialable mapping is the mesh's verdict only once its mates' peers files have
        # held the network's endpoints for longer than a reading may be old (a mapping changed
        # on a restart, a box just joined: not yet dialled, the fleet's own lag)
        current = {net: self._peers_settled(mem, net, rs)
                   for net, rs in self._by_network().items()}
        t.owed_ports = {h.label: h.port_owed for h in health if h.port_owed
                        and h.label in by_label and by_label[h.label].live
                        and h.label not in moves.values()
                        and (h.port_owed.startswith("no mapped")
                             or current.get(self.cfg.network_of(by_label[h.label].role),
                                            False))}
        rented: list[str] = []
        for role in self.cfg.roles.values():
            mine = [r for r in rows if r.role == role.name]
            running = next((m for m in mine if m.label in moves), None)
            owed_port = sorted((r for r in mine if r.label in t.owed_ports),
                               key=lambda r: r.created_at)
            if role.name in owing or running is not None:
                for r in owed_port:  # what the roster is owed first; one move at a time
                    wait = (f"its replacement {moves[r.label]} is on its way" if
                            r.label in moves else f"waits: a move of {running.label} runs"
                            if running is not None else "waits: the role is owed a box first")
                    self._act(t, f"{r.label}: owed a port ({t.owed_ports[r.label]}); {wait}")
                continue
            wanted = [(r, "port", t.owed_ports[r.label]) for r in owed_port] + \
                [(r, "place", None) for r in spread.crowded(mine, role)]
            for row, move_for, why in wanted:
                label = self._move(t, role, row, rows, mem.unfit_machines, move_for, why) \
                    if self._movable(t, row, failed) else None
                if label is not None:
                    rented.append(label)
                    break  # one per role per tick
        self._wait_ready(t, rented)
        return rented

    def _peers_settled(self, mem: Memory, network: str, rows: list[Row]) -> bool:
        """Whether the network's peers files hold its endpoints as they are now, written more
        than `ports.SETTLE_S` before this tick started (never: not settled)."""
        at = mem.peers_at.get(network)
        return mem.peers.get(network) == peers_sig(rows) and at is not None \
            and self._started_wall - epoch(at) > ports.SETTLE_S

    def _movable(self, t: Tick, row: Row, failed: set[str]) -> bool:
        return row.live and not (row.provider in failed or row.label in t.dead or unfinished(row)
                    or row.provider not in self.providers or row.label in self._unsure)

    def _move(self, t: Tick, role: Role, row: Row, rows: list[Row], unfit: Mapping[str, str],
              move_for: str, owed_why: str | None) -> str | None:
        """Rent the box `row` moves to: for a "place", on a place the role does not hold, in
        the same tier; for a "port", from an offer that maps the p2p port (free places
        first, like any rent). None when none is offered or the rent fails (said for a port,
        and for a failed rent; tried again next tick). An offer on a place where an earlier
        move of the box ended is passed over; after MOVE_TRIES such moves, the box stays until
        MOVE_COOLDOWN_S after the last of them ended (then they count no more: offers and hosts
        change)."""
        now = time.time()
        tried = [r for r in rows if r.move_of == row.label and not r.live
                 and (r.move_for or "place") == move_for
                 and now - _ended_at(r, now) < MOVE_COOLDOWN_S]
        said = f"{row.label}: owed a port ({owed_why}); " if move_for == "port" else ""
        if len(tried) >= MOVE_TRIES:
            if said:
                last = max(_ended_at(r, now) for r in tried)
                self._act(t, f"{said}it stays: {len(tried)} replacements ended without one "
                             f"(their rows say why); tried again in "
                             f"{last + MOVE_COOLDOWN_S - now:.0f} s")
            return None
        p = self.providers[row.provider]
        found, errors = offers_mod.search(role, [p], card=row.card, gpus=row.gpu_count,
                                          portless=False)
        held = spread.holders(rows, role.name)
        spent = {r.place for r in tried if r.place}
        # a port is sought elsewhere: the box's own host mapped none that worked
        spent |= {row.place} if move_for == "port" and row.place else set()
        fit = [o for o in found if (o.place is None or o.place not in spent)
               and f"{o.provider}/{o.machine_id}" not in unfit]
        if move_for == "place":
            fit = [o for o in spread.free_offers(fit, held)
                   if not row.cloud or o.cloud == row.cloud]
        if not fit:
            if said:
                asked = "; ".join(str(e) for e in errors) or \
                    f"{row.provider} offers no {row.card} x{row.gpu_count} that maps one"
                self._act(t, f"{said}it stays, tried again next tick: {asked}")
            return None  # a crowded box's row already says why it shares its place
        try:
            res = rent_mod.rent(self.cfg, self.reg, role, fit, self.providers,
                                label=self._successor(row.label, rows),
                                move_of=row.label, move_for=move_for, account=self._account())
        except (BudgetExceeded, ProviderError, UsageError) as e:
            what = "a replacement that maps one" if said else \
                f"shares {row.place}; a move to another place"
            self._act(t, f"{said or row.label + ': '}{what} failed: {e}")
            return None
        why = f"replace {row.label}, owed a port" if said else \
            f"move {row.label} off {row.place}"
        self._act(t, f"{res.row.label}: rented {res.row.card} x{res.row.gpu_count} on "
                     f"{res.row.place or res.row.provider} at ${res.row.usd_per_hour:.3f}/h "
                     f"to {why}")
        return res.row.label


def _owes_no_port(was: Health | None) -> bool:
    """Whether a box a port move replaces is proven to owe no port any more (its mapping
    listed late, and dialled): a fresh, passing check with inbound peers. A stale or unknown
    reading proves nothing, and never ends a move."""
    return was is not None and was.ssh and was.well and not was.port_owed \
        and (was.peers_in or 0) > 0


def _ended_at(row: Row, now: float) -> float:
    """When a row's box ended (its destroy, else its rent); `now` when it does not say."""
    when = row.destroyed_at or row.created_at
    return epoch(when) if when else now
