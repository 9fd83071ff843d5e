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
   for a day (`loop.json`). A box whose SSH answers but whose agent is down is converged
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
remembers between ticks (dead counts, re-rents owed, orphans first seen) is in `loop.json`
beside the registry, saved after every destroy and rent; `loop.lock` keeps a second loop off
the same registry.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from fleet.boxes import lifecycle
from fleet.boxes.inventory import Built, host_data
from fleet.boxes.sshkeys import write_known_hosts
from fleet.core import labels
from fleet.core.boxes import Row, is_standing, unfinished
from fleet.core.config import Config, Role
from fleet.core.errors import (
    BudgetExceeded,
    FleetError,
    NoCapacity,
    OfferGone,
    ProviderError,
    UsageError,
)
from fleet.core.times import now_iso, parse_iso
from fleet.core.verdicts import Health
from fleet.ops import budget, destroy, disruption, judgement, ports, spread
from fleet.ops import offers as offers_mod
from fleet.ops import owed as owed_mod
from fleet.ops import rent as rent_mod
from fleet.ops.check import MESH_IN
from fleet.providers.base import Box
from fleet.providers.sync import View, view
from fleet.state import bills
from fleet.state.loop_memory import Memory, Owe
from fleet.state.registry import Registry

if TYPE_CHECKING:
    from fleet.providers.base import Provider


@dataclass
class Late:
    """An unfinished rent's box to give up, and why; `sight`: only where the fleet's own
    SSH provably works this tick (the provider calls the box ready)."""

    row: Row
    box: Box
    why: str
    sight: bool


@dataclass
class Tick:
    number: int
    started_at: str
    actions: list[str] = field(default_factory=list)
    well: list[str] = field(default_factory=list)
    problems: dict[str, list[str]] = field(default_factory=dict)  # label -> what is wrong
    dead: dict[str, str] = field(default_factory=dict)  # label -> why, this tick
    replaced: dict[str, str] = field(default_factory=dict)  # old label -> new label
    converged: list[str] = field(default_factory=list)
    owed: list[Owe] = field(default_factory=list)
    owed_ports: dict[str, str] = field(default_factory=dict)  # label -> why it is owed a port
    orphans: list[str] = field(default_factory=list)
    provider_errors: list[str] = field(default_factory=list)
    converge_s: float = 0.0  # of took_s: the deploy and checks of what was converged
    converged_after_s: float | None = None  # from the tick's start to the conversion's end
    took_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["owed"] = [o.for_page().to_dict() | {"rerent_of": o.rerent_of} for o in self.owed]
        return d

    def summary(self) -> str:
        return (f"tick {self.number}: {len(self.well)} well, {len(self.problems)} with "
                f"problems, {len(self.dead)} dead, {len(self.replaced)} replaced, "
                f"{len(self.owed)} owed, {len(self.owed_ports)} owed a port, "
                f"{len(self.orphans)} orphans, "
                f"{len(self.provider_errors)} provider errors ({self.took_s:.1f} s)")


class LoopLock:
    """One loop per registry: an exclusive lock on `loop.lock` beside it, held while it runs."""

    def __init__(self, registry: Path) -> None:
        self.path = registry.parent / "loop.lock"
        self._f: IO[str] | None = None

    def __enter__(self) -> LoopLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 (held until __exit__)
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            pid = f.read().strip() or "?"
            f.close()
            raise UsageError(f"another fleet loop runs on {self.path.parent} (pid {pid}); "
                             "not starting a second") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._f = f
        return self

    def __exit__(self, *exc: object) -> None:
        if self._f is not None:
            self._f.close()


Converge = Callable[[Config, list[str]], str | None]
UNFIT_MACHINE_S = 24 * 3600
MOVE_TRIES = 3  # moves of one box (for a place, or for a port) that may end without a move
MOVE_COOLDOWN_S = 6 * 3600.0  # before it stays: until the last of them ended this long ago


# what runs after each tick with its verdicts (the CLI writes the fleet page there)
AfterTick = Callable[["Tick", list[Health]], None]


class AfterTickNote(FleetError):
    """Raised by an after-tick hook that did its main work (the page) but not all of it."""


class Loop:
    def __init__(self, cfg: Config, providers: Mapping[str, Provider], *,
                 destroy_orphans: bool = True, after_tick: AfterTick | None = None,
                 echo: Callable[[str], None] = print, converge_fn: Converge,
                 check_fn: Callable[[Config, Built], list[Health]],
                 peers_fn: Converge | None = None) -> None:
        self.cfg, self.providers = cfg, dict(providers)
        self.reg = Registry(cfg.registry)
        self.memory_path = cfg.registry.parent / "loop.json"
        self.destroy_orphans = destroy_orphans
        self.after_tick = after_tick
        self.echo = echo
        self.converge_fn = converge_fn
        self.check_fn = check_fn
        self.peers_fn = peers_fn  # rewrites peers files (None: this loop leaves them alone)
        # the providers whose boxes answered the fleet's SSH this tick, no breaker open
        self._sees: set[str] = set()
        self._unsure: set[str] = set()  # rows whose box this tick cannot tell (`View.unsure`)
        # unfinished rents whose box its provider calls SSH-ready and the fleet's SSH did not
        # reach this tick: evidence for the breakers, like a standing box not answering
        self._unreached: set[str] = set()
        self._adopted: set[str] = set()  # "provider/id" of the boxes adopted this tick
        self._started = time.monotonic()  # the tick's start
        self._started_wall = time.time()
        self._listing: budget.Listing | BudgetExceeded | None = None  # `_account`, per tick

    # -- one tick -------------------------------------------------------------------------

    def tick(self) -> Tick:
        mem = Memory.load(self.memory_path)
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
        mem.save(self.memory_path)  # the destroys and the re-rents they owe, before any rent
        self._forget_unfit(mem)
        fresh = self._rent_owed(t, mem)
        fresh += self._start_moves(t, mem, failed, health)
        self._converge(t, resumed + fresh)
        self._peers(t, mem, v)
        self._orphans(t, mem, v, failed)
        mem.owed = t.owed
        mem.save(self.memory_path)
        if self.after_tick is not None:
            try:
                self.after_tick(t, health)
            except AfterTickNote as e:  # the hook did its main work: what it could not do
                self._act(t, f"page: {e}")
            except (OSError, FleetError) as e:  # the fleet matters more than its picture
                self._act(t, f"page: not written ({e})")
        t.took_s = round(time.monotonic() - started, 2)
        return t

    def _note_stops(self, v: View) -> None:
        """Record when a listing first showed a box stopped (it then bills its storage only,
        for the estimate of what it spent), and forget it once the box runs again."""
        for row, box in v.matched:
            stopped = box.status in ("stopped", "exited")
            if stopped and row.stopped_at is None:
                self.reg.update(row.label, stopped_at=now_iso())
            elif not stopped and row.stopped_at is not None:
                self.reg.update(row.label, stopped_at=None)

    def _act(self, t: Tick, line: str) -> None:
        t.actions.append(line)
        self.echo(line)

    def _standing_rows(self) -> list[Row]:
        return [r for r in self.reg.rows()
                if r.live and is_standing(self.cfg, r) and r.host_key and r.provider_id]

    def _judge(self, t: Tick, mem: Memory, v: View, failed: set[str]) -> list[Health]:
        """Dead votes, agents to bring back, problems to report; returns the checks made.

        A death its provider reports (it lists the box exited or stopped) is counted as it is.
        Every other standing box is SSH-probed: one listed in any other status (`unknown` and
        `provisioning` too), and one its provider says it has no box of that id for, where it
        last was ("gone by id" is never a death alone; a one-shot box so gone is probed too,
        and marked vanished only when it does not answer). One that answers is alive. One that
        does not is dead, unless:
        + its provider lists it `provisioning`: restarting on the provider's side, no death
          before `[loop] restart_timeout_s` from when it was first seen so;
        + its provider's breaker is open (`_breakers`): many of its boxes fail at once in ways
          it does not confirm, which is more likely the fleet's path to it than deaths;
        + the fleet is blind: its own SSH key is unreadable, or more than half of all the boxes
          probed (two at least) fail SSH at once.
        A box not judged keeps its dead count. A lone box whose SSH fails is still counted dead:
        with one box the fleet cannot tell its own path from the box's death."""
        listed = {row.label: box for row, box in v.matched}
        gone = {r.label for r in v.gone}
        hosts, checked = [], []
        unjudged = set(v.unsure)
        death: dict[str, str] = {}  # label -> why it is dead if its SSH does not answer
        for row, seen in v.matched:  # a restart may map SSH to another port: pin the key there
            if seen.ssh_host and seen.ssh_port and \
                    (seen.ssh_host, seen.ssh_port) != (row.ssh_host, row.ssh_port):
                self.reg.update(row.label, ssh_host=seen.ssh_host, ssh_port=seen.ssh_port)
            if seen.place and seen.place != row.place:  # where its provider says it runs
                self.reg.update(row.label, place=seen.place)
            # a restart may map the p2p port anew, or a host stop mapping it: the peers files
            # follow (`_peers`), and a box left without one is owed a port (`fleet.ops.ports`)
            mapped = seen.p2p_endpoint((row.public_ip, row.p2p_public_port))
            if mapped != (row.public_ip, row.p2p_public_port):
                self.reg.update(row.label, public_ip=mapped[0], p2p_public_port=mapped[1])
        write_known_hosts(self.cfg.known_hosts, self.reg.rows())
        for row in self._standing_rows():
            if row.provider in failed:
                unjudged.add(row.label)
                continue  # the provider did not answer: nothing can be told, nothing changes
            box = listed.get(row.label)
            if box is not None and box.status in ("exited", "stopped"):
                t.dead[row.label] = f"{row.provider} lists it as {box.status}"
            elif box is not None:
                death[row.label] = f"SSH does not answer while its provider says {box.status}"
                hosts.append((row.label, host_data(self.cfg, row, box)))
            elif row.label in gone:
                death[row.label] = (f"{row.provider} has no box {row.provider_id} any more "
                                   "(asked by id), and SSH does not answer")
                hosts.append((row.label, host_data(self.cfg, row, _last_seen(row))))
        others = set()  # one-shot and other boxes gone by id: probed for SSH alone
        for row in v.gone:
            if row.host_key and row.ssh_host and not is_standing(self.cfg, row):
                others.add(row.label)
                death[row.label] = "no provider lists it any more, and SSH does not answer"
                hosts.append((row.label, host_data(self.cfg, row, _last_seen(row))))
        blind = self._blind_key() if hosts else None
        health = self.check_fn(self.cfg, Built(groups={"standing": hosts})) \
            if hosts and blind is None else []
        down = {h.label for h in health if not h.ssh}
        # deaths that are no one's path, of boxes their provider lists: it lost the box's host
        # too, or the box's sshd took the fleet's login and never ran the command (the path
        # works). A box it does not list may be its blindness: the breaker's to judge
        lost = {label for label, box in listed.items()
                if box.status == "unknown" or label in {h.label for h in health if h.hung}}
        # "no such box" by id from a provider whose listing shows the fleet's other boxes: the
        # key sees the fleet's account, so the box is gone (a restored registry's stale row)
        seeing = {row.provider for row, _ in v.matched}
        lost |= {r.label for r in v.gone if r.provider in seeing
                 and self._gap(v, r.provider) is None and is_standing(self.cfg, r)}
        quiet = down - lost
        judged = {label for label, _ in hosts} - lost
        if blind is None:
            blind = judgement.fleet_blind(quiet, judged)
        if blind is not None:
            self._act(t, f"breaker: no deaths counted this tick ({blind})")
            unjudged.update(label for label, _ in hosts)
        rows = {r.label: r for r in self.reg.rows()}
        answered = {rows[h.label].provider for h in health if h.ssh and h.label in rows}
        open_ = self._breakers(t, mem, v, {label for label, _ in hosts} | self._unreached,
                               down | self._unreached, answered)
        self._sees = set() if blind is not None else answered - set(open_)
        for row in v.gone:  # one-shot and other boxes: marked vanished, never re-rented
            if row.label in others:
                continue  # judged by their SSH below
            if row.provider in open_:
                unjudged.add(row.label)
            elif not is_standing(self.cfg, row):  # never SSH-ready: nothing to probe
                t.dead[row.label] = "no provider lists it any more"
        restarting = {lb: at for lb, at in mem.restarting.items() if lb in unjudged}
        for h in health:
            if not h.ssh:
                box = listed.get(h.label)
                # a restart lasts until SSH answers (a box listed running again may still be
                # booting), within its deadline
                if blind is None and box is not None and (
                        box.status == "provisioning"
                        or (box.status == "running" and h.label in mem.restarting)):
                    since = mem.restarting.get(h.label, now_iso())
                    if self._restarting(t, h.label, box, since):
                        restarting[h.label] = since
                        mem.dead.pop(h.label, None)  # the SSH it missed before was the restart's
                        unjudged.add(h.label)
                        continue
                    if box.status == "provisioning":  # past its deadline, and still says so
                        restarting[h.label] = since
                if blind is None and rows[h.label].provider in open_ and h.label not in lost:
                    unjudged.add(h.label)
                elif blind is None:
                    said = [p[len("ssh: "):] for p in h.problems if p.startswith("ssh: ")]
                    detail = f": {said[0]}" if said and said[0] != "box did not answer" else ""
                    t.dead[h.label] = death[h.label] + detail
                continue
            if h.label in gone:
                self._act(t, f"{h.label}: {rows[h.label].provider} has no box "
                             f"{rows[h.label].provider_id} (asked by id), but it answers SSH: "
                             "kept")
            if h.label in others:
                continue  # not a standing box: its SSH alone was asked
            checked.append(h)
            if h.well:
                t.well.append(h.label)
                continue
            t.problems[h.label] = h.problems
            if h.agent and h.admitted is False:  # e.g. RunPod placed it on another driver
                t.dead[h.label] = f"unfit: its agent refused admission ({h.admission_reason})"
            if not h.agent:
                t.converged.append(h.label)  # the agent back through the standing deploy
            for p in h.problems:
                if p.startswith("node: behind"):
                    self._act(t, f"{h.label}: {p[len('node: '):]} (reported; the loop never "
                                 "moves binaries)")
        mem.restarting = restarting
        for label in list(mem.dead):
            if label not in t.dead and label not in unjudged:
                del mem.dead[label]  # alive again, or no longer ours to judge
        for label, why in sorted(t.dead.items()):
            mem.dead[label] = mem.dead.get(label, 0) + 1
            word, _, why = why.partition(": ") if why.startswith("unfit") else ("dead", "", why)
            self._act(t, f"{label}: {word} ({why}), check {mem.dead[label]} of "
                         f"{self.cfg.loop.dead_checks}")
        return checked

    def _restarting(self, t: Tick, label: str, box: Box, since: str) -> bool:
        """Whether a box listed provisioning whose SSH does not answer is still within its
        restart's deadline (`[loop] restart_timeout_s`): then it is said, and no death."""
        age, limit = time.time() - _epoch(since), self.cfg.loop.restart_timeout_s
        if age >= limit:
            return False
        self._act(t, f"{label}: restarting on {box.provider}'s side ({box.status}, SSH down "
                     f"for {age:.0f} s of {limit:.0f}): no death before its deadline")
        return True

    def _breakers(self, t: Tick, mem: Memory, v: View, probed: set[str], down: set[str],
                  answered: set[str]) -> dict[str, str]:
        """The providers whose breaker is open this tick, each with why (said on the tick):
        of the boxes the tick judges there (those probed over SSH, and the live rows its
        listing left out), at least two, and more than half of those it does not report exited
        or stopped, fail at once (left out of its listing, or not answering SSH). A breaker
        open on the last tick stays open while none of the provider's boxes answers SSH (the
        path to it is not proven back): else the boxes it held would be destroyed one by one
        as the others are replaced. While it is open, the deaths the provider does not confirm
        are not counted; one that is no one's path is (a box it lists `unknown`: it lost the
        host too; a box whose sshd took the login and never ran the command).
        `answered`: the providers some of whose boxes answered SSH this tick."""
        stopped = {row.label for row, box in v.matched if box.status in ("exited", "stopped")}
        judged = (probed | v.unlisted) - stopped
        rows = self.reg.rows()
        out = judgement.breakers(
            {name: {r.label for r in rows if r.provider == name and r.label in judged}
             for name in self.providers}, v.unlisted, down, mem.breakers, answered)
        for name, why in out.items():
            self._act(t, f"breaker {name}: no death of its boxes counted this tick ({why}); "
                         f"more likely the fleet's path to {name}, or {name}'s own trouble, "
                         "than that many deaths (a death it reports still counts)")
        mem.breakers = sorted(out)
        return out

    def _blind_key(self) -> str | None:
        """Why the fleet's own SSH cannot work this tick (its key unreadable), or None."""
        try:
            with open(self.cfg.ssh_key, "rb") as f:
                f.read(1)
        except OSError as e:
            return f"the fleet's SSH key {self.cfg.ssh_key} is unreadable: {e.strerror}"
        return None

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
                held = box.status not in disruption.REPORTED_DOWN
                spend = self._spender(t, mem, label, t.dead[label], judged=held)
                if self._destroy(t, destroy.Order(label, seen_id=box.box_id, judged=True),
                                 "the dead box", spend) is None:
                    continue
                self._act(t, f"{label}: destroyed (dead or unfit on {count} checks)")
            else:
                if self._spend(t, mem, row.role, label, t.dead[label], judged=False) is None:
                    continue
                self.reg.mark_destroyed(label, "vanished")
                self._act(t, f"{label}: marked vanished (no provider lists it)")
            del mem.dead[label]
            if t.dead.get(label, "").startswith("unfit") and box is not None and box.machine_id:
                mem.unfit_machines[f"{row.provider}/{box.machine_id}"] = now_iso()
            moved = self.reg.get(row.move_of) if row.move_of else None
            if moved is not None and moved.live:
                self._act(t, f"{label}: it was moving {moved.label}, which stays: no re-rent "
                             "owed")
            elif moved is not None and any(o.rerent_of == moved.label for o in mem.rerents):
                self._act(t, f"{label}: it was moving {moved.label}, which died too: one "
                             "re-rent owed for both")
            elif is_standing(self.cfg, row):
                mem.rerents.append(Owe(row.role, row.provider, row.card, row.gpu_count,
                                       now_iso(), rerent_of=label, cloud=row.cloud))

    def _spend(self, t: Tick, mem: Memory, role: str, label: str, why: str, *,
               judged: bool = True) -> dict[str, Any] | None:
        """Take one destroy of `role`'s box `label` from the disruption budget, saved before
        the destroy (a loop killed after it still counts it); None, said, when the budget is
        spent and the box is kept. A destroy that is not the loop's own judgement (`judged`
        False: its provider reports the box down) is never held, and counts all the same. A
        destroy that failed is never given back (its terminate may have gone through: the
        provider's answer lost, the box slow to leave the listing); trying the same box again
        within the window spends nothing more."""
        now, loop = time.time(), self.cfg.loop
        again = [r for r in disruption.recent(mem.disruptions, role, now,
                                              loop.disruption_window_s) if r["label"] == label]
        if again:  # its window runs from this try: the destroy may happen only now
            again[0].update(at=now_iso(), at_epoch=now)
            mem.save(self.memory_path)
            return again[0]
        if judged:
            wanted = sum(w.count for w in self.cfg.roster if w.role == role)
            held = disruption.refusal(mem.disruptions, role, wanted, loop.disruption_fraction,
                                      loop.disruption_window_s, now)
            if held is not None:
                self._act(t, f"{label}: {held}; {label} kept ({why}; `fleet destroy {label}` "
                             "still works)")
                return None
        disruption.record(mem.disruptions, role, label, why, now)
        mem.save(self.memory_path)
        return mem.disruptions[-1]

    # -- peers files ----------------------------------------------------------------------

    def _peers(self, t: Tick, mem: Memory, v: View) -> None:
        """Rewrite the peers files of a role's standing boxes when its set of public p2p
        endpoints changed since they were last written (a box rented, re-rented or gone, a
        mapping changed on a restart): the peers deploy on every box of the role that
        answers; the nodes re-read the file, none restarts. A failure is said and tried again
        next tick (the memory keeps the last set written)."""
        if self.peers_fn is None:
            return
        skip = set(t.dead) | set(v.unsure)
        for role, rows in sorted(self._by_role().items()):
            if self.cfg.roles[role].p2p_port is None:
                continue
            sig = _peers_sig(rows)
            if mem.peers.get(role) == sig:
                continue
            labels = sorted(r.label for r in rows if r.label not in skip)
            if not labels:
                continue
            failure = self.peers_fn(self.cfg, labels)
            if failure:
                self._act(t, f"peers files of role {role}: {failure} (tried again next tick)")
                continue
            if len(labels) < len(rows):
                # a box this tick could not reach keeps an old file: written again next tick
                self._act(t, f"peers files of role {role} rewritten on {len(labels)} of "
                             f"{len(rows)} boxes (the others again next tick)")
                continue
            mem.peers[role], mem.peers_at[role] = sig, now_iso()
            dialable = sum(1 for r in rows if r.public_ip and r.p2p_public_port)
            self._act(t, f"peers files of role {role} rewritten on {len(labels)} boxes "
                         f"({dialable} dialable endpoints)")

    def _by_role(self) -> dict[str, list[Row]]:
        """The converged standing boxes (their agent installed) by role."""
        out: dict[str, list[Row]] = {}
        for r in self._standing_rows():
            if r.standing and r.role in self.cfg.roles:
                out.setdefault(r.role, []).append(r)
        return out

    # -- moves: a box that shares its place goes to a free one ---------------------------

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
            crowd = [lb for lb in others.get(new.place or "", []) if lb != new.label]
            age = time.time() - _epoch(new.created_at) if new.created_at else 0.0
            if new.move_for == "port":
                h, was = checks.get(new.label), checks.get(old.label)
                if _owes_no_port(was):
                    # a mapping listed late, a passing verdict: the old box is well again
                    self._abandon_move(t, new, old, failed, f"{old.label} owes no port any "
                                       "more")
                    continue
                why = self._ported(new, h)
                if why is None and new.label in done:
                    if self._destroy_judged(t, mem, old, failed,
                                            f"replaced by {new.label} for a port"):
                        self.reg.update(old.label, note=f"replaced by {new.label}, which maps "
                                                        f"a p2p port {new.public_ip}:"
                                                        f"{new.p2p_public_port}")
                        self._act(t, f"{old.label}: destroyed: replaced by {new.label} for a "
                                     "port, checked well, synced and dialled")
                    continue
                if age > self.cfg.loop.move_timeout_s and h is not None:  # never on a blind tick
                    self._abandon_move(t, new, old, failed, f"not done {age:.0f} s after its rent "
                                       f"(move_timeout_s {self.cfg.loop.move_timeout_s:.0f})")
                else:
                    self._act(t, f"{old.label}: kept until {new.label} is checked well, synced "
                                 f"and dialled ({why or 'not yet well and synced'})")
                continue
            if not new.place or crowd:
                where = new.place or "a place its provider does not name"
                held_by = f", held by {', '.join(crowd)}" if crowd else ""
                self._abandon_move(t, new, old, failed, f"it landed on {where}{held_by}")
                continue
            # a p2p role's move keeps its mesh: the new box mapped and dialled like a port's
            role = self.cfg.roles.get(new.role)
            ported = self._ported(new, checks.get(new.label)) \
                if role is not None and role.p2p_port else None
            if new.label not in done or ported is not None:
                if age > self.cfg.loop.move_timeout_s and new.label in checks:
                    self._abandon_move(t, new, old, failed, f"not well and synced {age:.0f} s "
                                       f"after its rent (move_timeout_s "
                                       f"{self.cfg.loop.move_timeout_s:.0f})")
                else:
                    self._act(t, f"{old.label}: moving to {new.label} ({new.place}); kept "
                                 f"until {new.label} is checked well and synced"
                                 + (f" and dialled ({ported})" if ported else ""))
                continue
            if self._destroy_judged(t, mem, old, failed, f"moved to {new.label}"):
                self.reg.update(old.label, note=f"moved to {new.label} ({new.place}), off "
                                                f"{old.place}")
                self._act(t, f"{old.label}: destroyed: moved to {new.label} on {new.place}, "
                             "checked well and synced")

    def _ported(self, new: Row, h: Health | None) -> str | None:
        """What a box rented for a port still lacks before its old box may go: a mapped p2p
        port, and as many inbound peers as the mesh needs, min(MESH_IN, its mates); None when
        it has both (its being well and synced is the caller's)."""
        if not (new.public_ip and new.p2p_public_port):
            return "no mapped p2p port listed yet"
        mates = len([r for r in self._by_role().get(new.role, []) if r.label != new.label])
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

    def _destroy_judged(self, t: Tick, mem: Memory, row: Row, failed: set[str],
                        what: str) -> bool:
        """`_destroy_row` for a box destroyed on the loop's own judgement: within the
        disruption budget only."""
        return self._destroy_row(t, row, failed, what,
                                 self._spender(t, mem, row.label, what))

    def _destroy_row(self, t: Tick, row: Row, failed: set[str], what: str,
                     spend: destroy.Spend | None = None) -> bool:
        """Destroy the box of a row the registry owns, by its provider id, through the one
        destroy path; False (said) when that cannot be told or done this tick."""
        if row.provider in failed or not row.provider_id or row.label in self._unsure:
            return False  # its provider is silent on it this tick: nothing is destroyed blind
        order = destroy.Order(row.label, seen_id=row.provider_id, judged=True)
        return self._destroy(t, order, f"it ({what})", spend) is not None

    def _destroy(self, t: Tick, order: destroy.Order, what: str,
                 spend: destroy.Spend | None = None) -> destroy.Destroyed | None:
        """`fleet.ops.destroy.destroy` for the loop: a refusal or a provider's failure is
        said (and tried again next tick), never raised; None then, or when `spend` kept it."""
        try:
            return destroy.destroy(self.cfg, self.reg, self.providers, order, spend=spend)
        except UsageError as e:  # a guard refused (`destroy.Refused`), or no API key
            self._act(t, f"{order.label}: not destroyed ({what}): {e}")
        except FleetError as e:  # the provider failed, or could not be asked (by label)
            self._act(t, f"{order.label}: destroying {what} failed ({e}); tried again next "
                         "tick")
        return None

    def _spender(self, t: Tick, mem: Memory, label: str, why: str, *,
                 judged: bool = True) -> destroy.Spend:
        """The disruption budget as the destroy path asks it, for the row it re-read."""
        return lambda row: self._spend(t, mem, row.role, label, why, judged=judged) is not None

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
        # held the role's endpoints for longer than a reading may be old (a mapping changed
        # on a restart, a box just joined: not yet dialled, the fleet's own lag)
        current = {role: self._peers_settled(mem, role, rs)
                   for role, rs in self._by_role().items()}
        t.owed_ports = {h.label: h.port_owed for h in health if h.port_owed
                        and h.label in by_label and by_label[h.label].live
                        and h.label not in moves.values()
                        and (h.port_owed.startswith("no mapped")
                             or current.get(by_label[h.label].role, False))}
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

    def _peers_settled(self, mem: Memory, role: str, rows: list[Row]) -> bool:
        """Whether the role's peers files hold its endpoints as they are now, written more
        than `ports.SETTLE_S` before this tick started (never: not settled)."""
        at = mem.peers_at.get(role)
        return mem.peers.get(role) == _peers_sig(rows) and at is not None \
            and self._started_wall - _epoch(at) > ports.SETTLE_S

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

    # -- the owed roster --------------------------------------------------------------------

    def owed(self, mem: Memory) -> list[Owe]:
        """What the roster is owed now (`fleet.ops.owed`), from the registry as it stands;
        the re-rents still owed are kept in `mem`."""
        mem.rerents, out = owed_mod.owed(self.cfg, self.reg.rows(), mem.rerents, mem.owed,
                                         now_iso())
        return out

    def _forget_unfit(self, mem: Memory) -> None:
        """A machine found unfit is passed over for UNFIT_MACHINE_S: its host may fix it."""
        now = time.time()
        for key, at in list(mem.unfit_machines.items()):
            if now - _epoch(at) > UNFIT_MACHINE_S:
                del mem.unfit_machines[key]

    def _rent_owed(self, t: Tick, mem: Memory) -> list[str]:
        rented = []
        for o in self.owed(mem):
            label = self._try_rent(t, o, mem.unfit_machines)
            if label is None:
                t.owed.append(o)
                continue
            rented.append(label)
            if o.rerent_of:
                mem.rerents.remove(o)
                t.replaced[o.rerent_of] = label
            mem.save(self.memory_path)  # the registry row is the truth; the memory follows it
        self._wait_ready(t, rented)
        return rented

    def _wait_ready(self, t: Tick, rented: list[str]) -> None:
        """Pin the host keys of the boxes rented this tick once SSH answers; those not ready
        in time are resumed next tick (`_resume_unfinished`)."""
        if not rented:
            return
        try:
            rent_mod.wait_ready(self.cfg, self.reg, self.providers, rented)
        except FleetError as e:
            self._act(t, f"waiting for SSH on {', '.join(rented)}: {e}")

    def _account(self) -> budget.Listing:
        """The account's listing the budget counts, read once a tick, at its first rent: the
        boxes rented after it are registry rows, which the budget counts anyway. A read that
        failed refuses every rent of the tick without asking the providers again (a 429 is
        not answered with more calls)."""
        if self._listing is None:
            try:
                self._listing = budget.listed(self.providers, "renting this tick")
            except BudgetExceeded as e:
                self._listing = e
        if isinstance(self._listing, BudgetExceeded):
            raise self._listing
        return self._listing

    def _try_rent(self, t: Tick, o: Owe, unfit: Mapping[str, str]) -> str | None:
        """Rent one owed box; None (and `o.reason` set) when it cannot be rented now. Offers
        on a machine where a box was found unfit are passed over."""
        role: Role = self.cfg.role(o.role)
        p = self.providers.get(o.provider)
        if p is None:
            o.reason = f"provider refusing: no {o.provider} API key"
            return None
        found, failures = offers_mod.search(role, [p], card=o.card, gpus=o.gpus)
        if o.cloud:
            found = [f for f in found if f.cloud == o.cloud]
        fit = [f for f in found if f"{f.provider}/{f.machine_id}" not in unfit]
        if found and not fit:
            o.reason = (f"no admissible offer: the {len(found)} offered are on machines "
                        "where a box was found unfit")
            self._act(t, f"owed {o.role} {o.card} x{o.gpus} on {o.provider}: {o.reason}")
            return None
        found = fit
        if not found:
            o.reason = (f"provider refusing: {failures[0]}" if failures
                        else self._no_offer(role, p, o))
            self._act(t, f"owed {o.role} {o.card} x{o.gpus} on {o.provider}: {o.reason}")
            return None
        try:
            res = rent_mod.rent(self.cfg, self.reg, role, found, self.providers,
                                label=self._label(o), rerent_of=o.rerent_of,
                                account=self._account())
        except BudgetExceeded as e:
            o.reason = f"over budget: {e}"
        except (NoCapacity, OfferGone) as e:  # every offer tried went or had no machine
            o.reason = f"no capacity: {e}"
        except ProviderError as e:
            o.reason = f"provider refusing: {e}"
        except UsageError as e:  # e.g. a label the provider refuses: this box, not the loop
            o.reason = f"refused: {e}"
        else:
            what = f" replacing {o.rerent_of}" if o.rerent_of else " (owed by the roster)"
            self._act(t, f"{res.row.label}: rented {res.row.card} x{res.row.gpu_count} on "
                         f"{res.row.provider} at ${res.row.usd_per_hour:.3f}/h{what}")
            return res.row.label
        self._act(t, f"owed {o.role} {o.card} x{o.gpus} on {o.provider}: {o.reason}")
        return None

    @staticmethod
    def _no_offer(role: Role, p: Provider, o: Owe) -> str:
        """No capacity (nothing of that card listed) or no admissible offer (listed, but not
        on the pinned driver or CUDA)."""
        try:
            listed = p.offers(card=o.card, gpu_count=o.gpus)
        except ProviderError as e:
            return f"provider refusing: {e}"
        if o.cloud:
            listed = [f for f in listed if f.cloud == o.cloud]
        if listed:
            return (f"no admissible offer: {len(listed)} listed, none with driver "
                    f"{role.admitted_driver} and CUDA {'/'.join(role.allowed_cuda) or 'any'}"
                    f"{' and a direct p2p port' if role.p2p_port else ''}")
        tier = f" on the {o.cloud} tier" if o.cloud else ""
        return f"no capacity: no {o.card} x{o.gpus} offered{tier}"

    def _label(self, o: Owe) -> str | None:
        return self._successor(o.rerent_of, self.reg.rows()) if o.rerent_of else None

    def _successor(self, label: str, rows: list[Row]) -> str | None:
        """The label of the box taking over from `label` (a re-rent or a move): its `-r<n>`
        where `label` has the fleet's exact form; else None, a generated label. A person may
        well call the box replacing their `web1` `web1-r1`: found by that label, theirs
        would be taken for the fleet's, adopted, even destroyed."""
        if not self._form().match(label):
            return None
        return labels.rerent_label(label, {r.label for r in rows})

    # -- unfinished rents -------------------------------------------------------------------

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
            if row is None or row.status != "vanished" or b.provider in failed \
                    or (row.provider, row.provider_id) != (b.provider, b.box_id) \
                    or key in v.duplicates or b.status != "running":
                continue  # one still restarting is revived once it runs
            shape = owed_mod.shape_of(row)
            # a re-rent of it not yet converted does not fill its place: the box that is back
            # runs already, and the re-rent is given up below
            pending = [r for r in live if r.rerent_of == row.label and unfinished(r)]
            if sum(1 for r in live if owed_mod.shape_of(r) == shape and r not in pending) \
                    >= owed_mod.wanted(self.cfg).get(shape, 0):
                continue
            self.reg.update(row.label, status=b.status, destroyed_at=None,
                            note=f"back: {row.provider} lists box {b.box_id} again after "
                                 "calling it gone")
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
        running = {row.label for row, box in v.matched if box.status == "running"}
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
        limit = self.cfg.loop.ready_timeout_s
        for row in self.reg.rows():
            if not (unfinished(row) and is_standing(self.cfg, row)) or row.provider in failed:
                continue
            p = self.providers.get(row.provider)
            if p is None or row.label in v.unsure:
                continue
            age = now - _epoch(row.created_at) if row.created_at else 0.0
            try:
                if not row.provider_id and not form.match(row.label):
                    self._hand_labelled(t, v, p, row, age)
                    continue
                box = listed.get(row.label) or lifecycle.find_unfinished(p, row)
                if box is None:
                    gap = self._gap(v, row.provider) if row.provider_id else None
                    if age > limit and gap:
                        self._act(t, f"{row.label}: {row.provider} has no box "
                                     f"{row.provider_id} by id, but its listing left out {gap}"
                                     " at once: kept, not given up this tick")
                    elif age > limit:
                        self._never_landed(t, row, age)
                    continue
                row = lifecycle.record(self.reg, row.label, box)
                key = lifecycle.host_key_if_ready(box)
                if key is None and box.ssh_ready:  # ready by its provider, unreached by SSH
                    self._unreached.add(row.label)
                if key is not None:
                    lifecycle.pin(self.reg, row, key)
                    pinned.append(row.label)
                    self._act(t, f"{row.label}: unfinished rent resumed: SSH-ready, host key "
                                 "pinned")
                elif box.status == "exited":
                    late.append(Late(row, box, f"{row.provider} lists it exited before it "
                                                "was ever SSH-ready", sight=False))
                elif age > limit:
                    # a box its provider says is ready, whose SSH the fleet cannot reach, is
                    # given up only where the fleet's own SSH provably works (`_give_up`),
                    # until three deadlines have passed: then it is never kept billing
                    late.append(Late(row, box, f"not SSH-ready {age:.0f} s after the rent "
                                     f"(ready_timeout_s {limit:.0f}, {box.status})",
                                     sight=box.ssh_ready and age <= 3 * limit))
                else:
                    self._act(t, f"{row.label}: waiting for SSH ({box.status}, {age:.0f} s "
                                 f"of {limit:.0f})")
            except FleetError as e:
                self._act(t, f"{row.label}: resuming the unfinished rent failed ({e}); tried "
                             "again next tick")
        if pinned:
            write_known_hosts(self.cfg.known_hosts, self.reg.rows())
        return pinned, late

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

    def _gap(self, v: View, provider: str) -> str | None:
        """How many of `provider`'s live boxes its listing left out, where that is at least two
        and more than half of them: a gap across the provider (another account's key, an
        incident), in which no "no such box" is believed. None otherwise."""
        return judgement.gap([r.label for r in self.reg.rows()
                              if r.live and r.provider == provider and r.provider_id],
                             v.unlisted)

    def _role_of(self, label: str) -> str:
        """The role a label of this fleet's form (`_form`) begins with, the longest first."""
        return next(r for r in sorted(self.cfg.roles, key=len, reverse=True)
                    if label.startswith(f"{r}-"))

    def _form(self) -> re.Pattern[str]:
        """The exact form of the labels this fleet makes (`fleet.core.labels`)."""
        return labels.fleet_form(tuple(self.cfg.roles), self.reg.fleet_id())

    def _never_landed(self, t: Tick, row: Row, age: float) -> None:
        if row.provider_id:  # it had a box, which its provider no longer has
            self.reg.mark_destroyed(row.label, "vanished")
            self._act(t, f"{row.label}: unfinished rent given up: {row.provider} has no box "
                         f"{row.provider_id} any more")
            return
        self.reg.update(row.label, status="failed", destroyed_at=now_iso(),
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
            spend = self._spender(t, mem, g.row.label, g.why, judged=g.box.status not in
                                  disruption.REPORTED_DOWN) if adopted else None
            if self._destroy(t, order, f"it ({g.why})", spend) is None:
                continue
            self._act(t, f"{g.row.label}: destroyed: {g.why}")
            if g.box.status == "exited" and g.box.machine_id:
                mem.unfit_machines[f"{g.row.provider}/{g.box.machine_id}"] = now_iso()

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
                self.reg.update(row.label, status="destroyed", destroyed_at=now_iso())
                self._act(t, f"{row.label}: destroyed ({row.destroy_wanted}): {row.provider} "
                             f"has no box {row.provider_id} any more (asked by id)")
                continue
            # by its id (the client tells a box gone from one its key cannot see), else every
            # box under its label
            order = destroy.Order(row.label, seen_id=row.provider_id, force=True)
            if self._destroy(t, order, f"it ({row.destroy_wanted})") is None:
                continue
            self._act(t, f"{row.label}: destroyed ({row.destroy_wanted})")

    # -- conversion and orphans ------------------------------------------------------------

    def _converge(self, t: Tick, fresh: list[str]) -> None:
        labels = sorted(set(fresh) | set(t.converged))
        ready = [lb for lb in labels if (r := self.reg.get(lb)) is not None and r.host_key]
        t.converged = []
        if not ready:
            return
        started = time.monotonic()
        failure = self.converge_fn(self.cfg, ready)
        t.converge_s = round(time.monotonic() - started, 2)
        t.converged_after_s = round(time.monotonic() - self._started, 2)
        if failure:
            self._act(t, f"converging {', '.join(ready)}: {failure} (tried again next tick)")
            return
        t.converged = ready
        self._act(t, f"converged and checked: {', '.join(ready)}")

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
            age = now - _epoch(seen[key])
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


def _owes_no_port(was: Health | None) -> bool:
    """Whether a box a port move replaces is proven to owe no port any more (its mapping
    listed late, and dialled): a fresh, passing check with inbound peers. A stale or unknown
    reading proves nothing, and never ends a move."""
    return was is not None and was.ssh and was.well and not was.port_owed \
        and (was.peers_in or 0) > 0


def _peers_sig(rows: list[Row]) -> str:
    """A role's set of public p2p endpoints, as the peers files were last written for it."""
    return " ".join(sorted(f"{r.label}={r.public_ip}:{r.p2p_public_port}" for r in rows))


def _last_seen(row: Row) -> Box:
    """A box its provider says it no longer has, where its row last saw it: to probe its SSH."""
    assert row.provider_id is not None
    return Box(row.provider, row.provider_id, row.label, row.card, row.gpu_count,
               row.usd_per_hour, "gone", ssh_host=row.ssh_host, ssh_port=row.ssh_port)


def _epoch(iso: str) -> float:
    return parse_iso(iso).timestamp()


def _ended_at(row: Row, now: float) -> float:
    """When a row's box ended (its destroy, else its rent); `now` when it does not say."""
    when = row.destroyed_at or row.created_at
    return _epoch(when) if when else now


def run(loop: Loop, interval_s: float, once: bool, emit: Callable[[Tick], None]) -> None:
    """Tick every `interval_s` seconds (from the start of one tick to the next; a tick that
    takes longer is followed at once), or once."""
    while True:
        started = time.monotonic()
        try:
            emit(loop.tick())
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
