"""`fleet loop`: keep the standing fleet up without anyone watching.

Each tick:
1. Lists every provider's boxes against the registry (`fleet.providers.sync.view`). A provider that
   fails is reported and its boxes are not judged this tick: an API error is never death.
   A box the listing leaves out is gone only once its provider, asked for its id, says so,
   and even then it is probed over SSH before it is judged (step 3).
   A listing row that cannot be read is said and skipped: the rows it may be are not judged,
   moved or destroyed, and it is never an orphan; the rest of the listing goes on.
2. Resumes the rents that never finished (`_resume_unfinished`): each is looked up, pinned
   once SSH-ready and converted, or given up past `ready_timeout_s` (one whose box its
   provider says it has no more is kept while that provider's listing leaves out most of its
   boxes at once: `_gap`).
3. Checks every standing box at once (the agent's status through one SSH command each, as
   `fleet check`). A box is *dead* on a check when its provider lists it as exited or
   stopped, or when SSH does not answer: a box its provider lists in any other status
   (`unknown`, `provisioning` too) is probed, and so is one its provider says it has no box
   of that id for, where it last was ("gone by id" is never a death alone). Deaths are judged
   per provider: when at least two of one provider's boxes, and more than half of those the
   tick judges there, fail at once in ways it does not confirm (left out of its listing, SSH
   not answering), that provider's breaker counts none of their deaths this tick and says
   why; a death it reports (exited, stopped) still counts. No SSH death counts either when
   the fleet's own SSH key is unreadable or more than half of all the boxes probed (two at
   least) fail SSH at once: that is the fleet's blindness. A box listed `provisioning` whose
   SSH does not answer is restarting on its provider's side: no death before `[loop]
   restart_timeout_s` (15 minutes) from when it was first seen so. A lone box whose SSH fails
   is still a death: with one box the fleet cannot tell its own path from the box's end.
   Dead on `dead_checks` consecutive ticks (fleet.toml `[loop]`, default 2), it is destroyed
   where the provider still lists it (its row marked destroyed, or vanished when no provider
   has it) and owed for a re-rent in the same shape: provider, card, GPU count and role (so
   the same image, driver pin, allowed CUDA and p2p port), labelled `<label>-r<n>`,
   `rerent_of` set. A box whose agent refuses admission (a driver other than the pinned
   one, an unqualified GPU: RunPod advertises no driver, so admission after boot is the
   only guard) is *unfit*, counted like a dead one: kept, it would bill for a card that
   never works. Its machine (where the provider names it) is passed over by the re-rents
   for a day (the loop's memory). A box whose SSH answers but whose agent is down is converged
   again (its agent back).
4. Rents what is owed: the re-rents no live row fills yet, and the roster's wanted boxes
   (`[[roster.ROLE]]`) that no live box fills, cheapest admissible offer first, each within
   the daily budget (the budget check and the registry row are one locked step). What
   cannot be rented stays owed with the reason: no capacity, no admissible offer, over
   budget, provider refusing.
5. Converts what it rented or resumed, and the boxes whose agent was down, with the
   standing deploy, then verifies them with the testinfra checks: only then is a
   replacement done.
6. Reports orphans (boxes under a label of this fleet's roles that the registry does not
   own, and second boxes under a live label) and destroys, once seen for `orphan_grace_s`,
   only those whose label has this fleet's exact form (`fleet.core.labels`), never while the
   registry is empty or the orphans outnumber its live boxes.
7. Runs its after-tick hook: the CLI writes the fleet page there (index.html and fleet.json,
   each replaced whole).

Boxes behind their wanted release are reported; the loop never moves binaries. What the loop
remembers between ticks (dead counts, re-rents owed, orphans first seen) is kept
in the state database, saved after every destroy and rent. One loop leads a fleet
(`fleet.state.leader`): a second waits as a standby, and takes over when the first's lease ends.
"""


from __future__ import annotations

import sys
import time
from collections.abc import Callable

from fleet.core.errors import FleetError, NotLeader, StateError, UsageError
from fleet.core.times import now_iso
from fleet.ops import disruption
from fleet.ops import rent as rent_mod
from fleet.ops.loop.base import (
    MOVE_COOLDOWN_S,
    MOVE_TRIES,
    UNFIT_MACHINE_S,
    AfterTick,
    AfterTickNote,
    Converge,
    Late,
    Tick,
)
from fleet.ops.loop.judge import Judging
from fleet.ops.loop.moves import Moving
from fleet.ops.loop.orphans import Sweeping
from fleet.ops.loop.peers import Peering
from fleet.ops.loop.renting import Renting
from fleet.ops.loop.replace import Replacing
from fleet.ops.loop.resume import Resuming
from fleet.providers.sync import view
from fleet.state import bills
from fleet.state.leader import Fence, Leadership
from fleet.state.loop_memory import Memory

__all__ = ["MOVE_COOLDOWN_S", "MOVE_TRIES", "UNFIT_MACHINE_S", "AfterTick", "AfterTickNote",
           "Converge", "Late", "Loop", "Tick", "lead", "now_iso", "rent_mod", "run"]


class Loop(Judging, Replacing, Resuming, Renting, Moving, Peering, Sweeping):
    """One fleet loop over a registry: `tick` runs the phases in order."""

    def tick(self) -> Tick:
        mem = Memory.load(self.cfg.registry)
        mem.tick += 1
        mem.disruptions = disruption.prune(mem.disruptions, time.time(),
                                           self.cfg.loop.disruption_window_s)
        t = Tick(mem.tick, now_iso())
        started = self._started = time.monotonic()
        self._started_wall = time.time()  # the checks' readings are no older than this
        self._listing = None
        v = view(self.reg, self.providers)
        failed = set()
        for e in v.failures:
            failed.add(e.provider)
            self._act(t, f"provider {e.provider}: {e} (its boxes are not judged this tick)")
            t.provider_errors.append(str(e))
        for label, why in sorted(v.unsure.items()):
            self._act(t, f"{label}: not judged this tick: {why}")
        for u in v.unreadable:  # those no row is waiting on were not said above
            if str(u) not in v.unsure.values():
                self._act(t, f"{u}: skipped this tick (never judged, destroyed or swept)")
        self._unsure = set(v.unsure)
        self._unreached = set()
        self._adopted = set()
        self._note_stops(v)
        read = bills.refresh(self.cfg.registry, self.providers)  # for the rents and the page
        for name, why in read.errors.items():
            self._act(t, f"bills: {name} gave none ({why}); its boxes are estimated")
        self._destroy_wanted(t, v, failed)
        self._revive_vanished(t, mem, v, failed)
        self._adopt_unrecorded(t, v, failed)
        resumed, late = self._resume_unfinished(t, v, failed)
        health = self._judge(t, mem, v, failed)
        self._give_up(t, mem, late, sees=self._sees)
        self._replace_dead(t, mem, v)
        self._finish_moves(t, mem, health, failed)
        self._save(mem)  # the destroys and the re-rents they owe, before any rent
        self._forget_unfit(mem)
        fresh = self._rent_owed(t, mem)
        fresh += self._start_moves(t, mem, failed, health)
        self._converge(t, resumed + fresh)
        self._peers(t, mem, v)
        self._orphans(t, mem, v, failed)
        mem.owed = t.owed
        self._save(mem)
        if self.after_tick is not None:
            try:
                self.after_tick(t, health)
            except AfterTickNote as e:  # the hook did its main work: what it could not do
                self._act(t, f"page: {e}")
            except (OSError, FleetError) as e:  # the fleet matters more than its picture
                self._act(t, f"page: not written ({e})")
        t.took_s = round(time.monotonic() - started, 2)
        return t


def run(loop: Loop, interval_s: float, once: bool, emit: Callable[[Tick], None],
        leading: Leadership | None = None) -> None:
    """Tick every `interval_s` seconds (from the start of one tick to the next; a tick that
    takes longer is followed at once), or once. With `leading`, each tick starts only while
    this loop still leads: NotLeader otherwise, as from any rent, destroy or save within it."""
    while True:
        started = time.monotonic()
        try:
            why = leading.lost() if leading is not None else None
            if why is not None:
                raise NotLeader(f"this loop no longer leads: {why}")
            emit(loop.tick())
        except NotLeader:
            raise  # it acts no more: `lead` campaigns again
        except FleetError as e:
            if once or e.exit_code == 2:  # a mistake of the operator's stops the loop
                raise
            # anything else (a registry write on a full disk, a provider's odd answer): said,
            # and the next tick tries again; the loop itself never stops for it
            print(f"tick failed: {e}", file=sys.stderr, flush=True)
        except Exception as e:  # a KeyError from an odd listing, an OSError from a full disk
            if once:
                raise
            print(f"tick failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        if once:
            return
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))


STANDBY_POLL_S = 2.0  # a standby asks for the lead this often


def lead(leading: Leadership, make: Callable[[Fence], Loop], interval_s: float, once: bool,
         emit: Callable[[Tick], None], say: Callable[[str], None],
         poll_s: float = STANDBY_POLL_S, standby_work: Callable[[], int] | None = None
         ) -> None:
    """Campaign for the lead and run the loop while it lasts; wait as a standby while another
    leads (said once per leader); lose it and campaign again, with a new loop: nothing of the
    old one's tick carries on. `--once` does not wait: another loop leading is exit 2.
    A standby does `standby_work` between its polls (its share of the leader's checks,
    `fleet.ops.shared_check.work`); while that finds work, it polls again at once. A database
    that does not answer is said once and asked again every `poll_s`: the loop waits for it,
    it never exits for it (`--once` does: exit 1)."""
    shown: tuple[str, int] | None = None
    down: str | None = None  # why the database did not answer, while it does not
    while True:
        try:
            fence = leading.campaign()
            now = leading.current() if fence is None else None
        except StateError as e:
            if once:
                raise
            if down is None:
                say(f"the state database did not answer ({e}); campaigning again every "
                    f"{poll_s:g} s")
            down = str(e)
            time.sleep(poll_s)
            continue
        if down is not None:
            say("the state database answers again")
            down = None
        if fence is None:
            who = (f"{now.holder} (epoch {now.epoch}, leading since {now.since}, last seen "
                   f"{now.seen_at})") if now else "another process"
            if once:
                raise UsageError(f"another fleet loop leads this fleet: {who}; not starting a "
                                 "second")
            if shown != (now.holder if now else "", now.epoch if now else 0):
                say(f"standby: the loop of {who} leads; waiting to take over")
                shown = (now.holder if now else "", now.epoch if now else 0)
            if standby_work is not None and standby_work():
                continue
            time.sleep(poll_s)
            continue
        shown = None
        say(f"leading as {fence.holder} (epoch {fence.epoch})")
        try:
            run(make(fence), interval_s, once, emit, leading)
            return
        except NotLeader as e:
            leading.resign()
            say(f"lost the lead ({e}); campaigning again")
            if once:
                raise
