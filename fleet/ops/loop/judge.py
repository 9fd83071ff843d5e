"""Step 3 of a tick: every standing box checked at once, and judged: dead, unfit, restarting,
or not judged (its provider silent, its breaker open, the fleet blind). The rules themselves
are pure (`fleet.ops.judgement`); this gathers the listings and the checks for them."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fleet.boxes import lifecycle
from fleet.boxes.boxssh import KEY_REFUSED
from fleet.boxes.inventory import Built, host_data
from fleet.boxes.sshkeys import write_known_hosts
from fleet.core.boxes import Row, is_standing
from fleet.core.states import DOWN, NODE_PROBLEM, BoxStatus, ReleaseOrder, node_release
from fleet.core.times import now_iso
from fleet.core.verdicts import Death, Health
from fleet.ops import judgement, shared_check
from fleet.ops.loop.base import LoopBase, Tick, epoch
from fleet.providers.base import Box
from fleet.providers.sync import View
from fleet.state import claims
from fleet.state.loop_memory import Memory


class Judging(LoopBase):
    def _check(self, t: Tick, hosts: list[tuple[str, dict[str, Any]]]) -> list[Health]:
        """The checks of `hosts`: on PostgreSQL shared with the standbys' machines, whose
        results the loop waits for up to half an interval (`fleet.ops.shared_check`); on
        SQLite, all of them here."""
        if not self.reg.db.postgres:
            return self.check_fn(self.cfg, Built(groups={"standing": hosts}))
        return shared_check.lead(self.reg.db, self.cfg, t.number, hosts, self.check_fn,
                                 wait_s=min(self.cfg.loop.interval_s / 2, claims.CLAIM_S),
                                 fence=self.fence)

    def _note_stops(self, v: View) -> None:
        """Record when a listing first showed a box stopped (it then bills its storage only,
        for the estimate of what it spent), and forget it once the box runs again."""
        for row, box in v.matched:
            stopped = box.status in DOWN
            if stopped and row.stopped_at is None:
                self.reg.update(row.label, stopped_at=now_iso())
            elif not stopped and row.stopped_at is not None:
                self.reg.update(row.label, stopped_at=None)

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
        self._follow_listings(v)
        p = self._probes(t, v, failed)
        blind = self._blind_key() if p.hosts else None
        health = self._check(t, p.hosts) if p.hosts and blind is None else []
        down = {h.label for h in health if not h.ssh}
        lost = self._lost(v, p, health)
        # a box presenting another host key than the one pinned: re-pinned on its provider's
        # word, else judged as any box whose SSH does not answer (the fleet's own blindness,
        # a proxy on its path, reads the same)
        repinned = self._changed_keys(t, mem, health, p.listed, p.others)
        if blind is None:
            blind = judgement.fleet_blind(down - lost - repinned, p.probed() - lost)
        if blind is not None:
            self._act(t, f"breaker: no deaths counted this tick ({blind})")
            p.unjudged.update(p.probed())
        rows = {r.label: r for r in self.reg.rows()}
        answered = {rows[h.label].provider for h in health if h.ssh and h.label in rows}
        open_ = self._breakers(t, mem, v, p.probed() | self._unreached,
                               down | self._unreached, answered)
        self._sees = set() if blind is not None else answered - set(open_)
        self._vanished(t, v, p, open_)
        seen = _Seen(blind is not None, open_, lost, rows)
        restarting = {lb: at for lb, at in mem.restarting.items() if lb in p.unjudged}
        checked: list[Health] = []
        for h in health:
            if h.label in repinned:
                mem.dead.pop(h.label, None)  # checked under its new key from the next tick
                p.unjudged.add(h.label)
            elif not h.ssh:
                self._unanswered(t, mem, h, p, seen, restarting)
            elif self._answered(t, h, p, seen):
                mem.answered[h.label] = _listed_now(p.listed.get(h.label))  # its pinned key
                checked.append(h)
                self._verdict(t, h)
        mem.restarting = restarting
        self._count_deaths(t, mem, p.unjudged)
        return checked

    def _follow_listings(self, v: View) -> None:
        """Record what the listings changed of the matched boxes (one commit): a restart may
        map SSH to another port (the key pinned there), its provider may name another place,
        a restart or a host stop may map the p2p port anew (the peers files follow,
        `_peers`, and a box left without one is owed a port, `fleet.ops.ports`)."""
        moved: dict[str, dict[str, Any]] = {}
        for row, seen in v.matched:
            change = moved.setdefault(row.label, {})
            if seen.ssh_host and seen.ssh_port and \
                    (seen.ssh_host, seen.ssh_port) != (row.ssh_host, row.ssh_port):
                change.update(ssh_host=seen.ssh_host, ssh_port=seen.ssh_port)
            if seen.place and seen.place != row.place:  # where its provider says it runs
                change.update(place=seen.place)
            mapped = seen.p2p_endpoint((row.public_ip, row.p2p_public_port))
            if mapped != (row.public_ip, row.p2p_public_port):
                change.update(public_ip=mapped[0], p2p_public_port=mapped[1])
        self.reg.update_many({label: c for label, c in moved.items() if c})
        write_known_hosts(self.cfg.known_hosts, self.reg.rows())

    def _probes(self, t: Tick, v: View, failed: set[str]) -> _Probes:
        """The deaths the listings report (counted on `t`), and the boxes to probe over SSH,
        each with why it is dead if it does not answer."""
        p = _Probes({row.label: box for row, box in v.matched}, {r.label for r in v.gone},
                    set(v.unsure))
        for row in self._standing_rows():
            if row.provider in failed:
                p.unjudged.add(row.label)
                continue  # the provider did not answer: nothing can be told, nothing changes
            box = p.listed.get(row.label)
            if box is not None and box.status in DOWN:
                t.dead[row.label] = Death.dead(f"{row.provider} lists it as {box.status}")
            elif box is not None:
                p.probe(row.label, host_data(self.cfg, row, box),
                        f"SSH does not answer while its provider says {box.status}")
            elif row.label in p.gone:
                p.probe(row.label, host_data(self.cfg, row, _last_seen(row)),
                        f"{row.provider} has no box {row.provider_id} any more (asked by id), "
                        "and SSH does not answer")
        for row in v.gone:  # one-shot and other boxes gone by id: probed for SSH alone
            if row.host_key and row.ssh_host and not is_standing(self.cfg, row):
                p.others.add(row.label)
                p.probe(row.label, host_data(self.cfg, row, _last_seen(row)),
                        "no provider lists it any more, and SSH does not answer")
        return p

    def _lost(self, v: View, p: _Probes, health: list[Health]) -> set[str]:
        """The deaths that are no one's path, of boxes their provider lists: it lost the box's
        host too, or the box's sshd took the fleet's login and never ran the command (the
        path works). A box it does not list may be its blindness: the breaker's to judge. And
        a standing box "no such box" by id from a provider whose listing shows the fleet's
        other boxes: the key sees the fleet's account, so the box is gone (a restored
        registry's stale row)."""
        hung = {h.label for h in health if h.hung}
        lost = {label for label, box in p.listed.items()
                if box.status == BoxStatus.UNKNOWN or label in hung}
        seeing = {row.provider for row, _ in v.matched}
        return lost | {r.label for r in v.gone if r.provider in seeing
                       and self._gap(v, r.provider) is None and is_standing(self.cfg, r)}

    def _vanished(self, t: Tick, v: View, p: _Probes, open_: dict[str, str]) -> None:
        """The one-shot and other boxes gone by id that were never SSH-ready (nothing to
        probe): marked vanished, never re-rented; not judged behind an open breaker."""
        for row in v.gone:
            if row.label in p.others:
                continue  # judged by their SSH
            if row.provider in open_:
                p.unjudged.add(row.label)
            elif not is_standing(self.cfg, row):
                t.dead[row.label] = Death.dead("no provider lists it any more")

    def _unanswered(self, t: Tick, mem: Memory, h: Health, p: _Probes, seen: _Seen,
                    restarting: dict[str, str]) -> None:
        """A probed box whose SSH did not answer: restarting on its provider's side (within
        its deadline), not judged (the fleet blind, its provider's breaker open), or dead."""
        box = p.listed.get(h.label)
        # a restart lasts until SSH answers (a box listed running again may still be
        # booting), within its deadline
        if not seen.blind and box is not None and (
                box.status == BoxStatus.PROVISIONING
                or (box.status == BoxStatus.RUNNING and h.label in mem.restarting)):
            since = mem.restarting.get(h.label, now_iso())
            if self._restarting(t, h.label, box, since):
                restarting[h.label] = since
                mem.dead.pop(h.label, None)  # the SSH it missed before was the restart's
                p.unjudged.add(h.label)
                return
            if box.status == BoxStatus.PROVISIONING:  # past its deadline, and still says so
                restarting[h.label] = since
        if seen.blind:
            return
        if seen.rows[h.label].provider in seen.open_ and h.label not in seen.lost:
            p.unjudged.add(h.label)
            return
        said = [q[len("ssh: "):] for q in h.problems if q.startswith("ssh: ")]
        detail = f": {said[0]}" if said and said[0] != "box did not answer" else ""
        t.dead[h.label] = Death.dead(p.death[h.label] + detail)

    def _answered(self, t: Tick, h: Health, p: _Probes, seen: _Seen) -> bool:
        """A probed box whose SSH answered: alive. Whether it is a standing box to judge by
        its check (not a one-shot box, whose SSH alone was asked)."""
        if h.label in p.gone:
            row = seen.rows[h.label]
            self._act(t, f"{h.label}: {row.provider} has no box {row.provider_id} (asked by "
                         "id), but it answers SSH: kept")
        return h.label not in p.others

    def _verdict(self, t: Tick, h: Health) -> None:
        """A standing box's check, on the tick: well, or its problems (unfit where its agent
        refused admission, its agent to bring back where none answered)."""
        if h.well:
            t.well.append(h.label)
            return
        t.problems[h.label] = h.problems
        if h.agent and h.admitted is False:  # e.g. RunPod placed it on another driver
            t.dead[h.label] = Death.unfit(f"its agent refused admission ({h.admission_reason})")
        if not h.agent:
            t.converged.append(h.label)  # the agent back through the standing deploy
        for problem in h.problems:
            if node_release(problem) is ReleaseOrder.BEHIND:
                self._act(t, f"{h.label}: {problem[len(NODE_PROBLEM):]} (reported; the loop "
                             "never moves binaries)")

    def _count_deaths(self, t: Tick, mem: Memory, unjudged: set[str]) -> None:
        """The dead counts: one more for each box dead this tick (said), none for one alive
        again or no longer the loop's to judge; a box not judged keeps its count."""
        standing = {r.label for r in self._standing_rows()}
        mem.answered = {lb: at for lb, at in mem.answered.items() if lb in standing}
        for label in list(mem.dead):
            if label not in t.dead and label not in unjudged:
                del mem.dead[label]  # alive again, or no longer ours to judge
        for label, death in sorted(t.dead.items()):
            mem.dead[label] = mem.dead.get(label, 0) + 1
            self._act(t, f"{label}: {death.said()}, check {mem.dead[label]} of "
                         f"{self.cfg.loop.dead_checks}")

    def _changed_keys(self, t: Tick, mem: Memory, health: list[Health],
                      listed: dict[str, Box], others: set[str]) -> set[str]:
        """The standing boxes whose SSH did not answer and that present another host key than
        the one pinned, re-pinned now: only on the provider's word that it is the same box
        restarted (`judgement.repin_refusal`), said in one line, the master made under the old
        key closed, the restart's word spent. A refusal is said too."""
        repinned: set[str] = set()
        probe: list[tuple[Row, Box]] = []
        for h in health:
            box, row = listed.get(h.label), self.reg.get(h.label)
            if not h.ssh and h.label not in others and _key_refused(h) and box is not None \
                    and row is not None and box.ssh_ready and row.host_key:
                probe.append((row, box))
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(probe)))) as pool:
            keys = list(pool.map(lambda rb: lifecycle.host_key_if_ready(rb[1]), probe))
        for (row, box), key in zip(probe, keys, strict=True):
            if key is None or key == row.host_key:
                continue  # no answer now, or the pinned key after all: judged as it is
            then = mem.answered.get(row.label)
            why = judgement.repin_refusal(row.provider, row.provider_id, box.box_id,
                                          box.machine_id, box.uptime_s, then)
            if why is not None:
                self._act(t, f"{row.label}: presents another SSH host key than the one "
                             f"pinned, and {why}: not re-pinned")
                continue
            assert then is not None and box.uptime_s is not None  # repin_refusal's word
            lifecycle.repin(self.reg, row, key)
            write_known_hosts(self.cfg.known_hosts, self.reg.rows())
            # the restart is spent: another key needs another restart listed after this one
            mem.answered[row.label] = _listed_now(box)
            self._act(t, f"{row.label}: SSH host key re-pinned: {row.provider} lists "
                         f"{box.box_id} up {box.uptime_s:.0f} s, where it listed "
                         f"{then['uptime_s']:.0f} s when it last answered: restarted since, "
                         "and its new container made a new key")
            repinned.add(row.label)
        return repinned

    def _restarting(self, t: Tick, label: str, box: Box, since: str) -> bool:
        """Whether a box listed provisioning whose SSH does not answer is still within its
        restart's deadline (`[loop] restart_timeout_s`): then it is said, and no death."""
        age, limit = time.time() - epoch(since), self.cfg.loop.restart_timeout_s
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
        stopped = {row.label for row, box in v.matched if box.status in DOWN}
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


@dataclass
class _Probes:
    """The boxes a tick probes over SSH, and what it knows of them before the answers."""

    listed: dict[str, Box]  # label -> its box, as its provider lists it
    gone: set[str]  # the live rows whose provider said, asked by id, it has no such box
    unjudged: set[str]  # the boxes nothing is told of this tick: their dead counts kept
    hosts: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    death: dict[str, str] = field(default_factory=dict)  # label -> why dead if SSH is silent
    others: set[str] = field(default_factory=set)  # one-shot and other boxes: SSH alone

    def probe(self, label: str, data: dict[str, Any], death: str) -> None:
        self.hosts.append((label, data))
        self.death[label] = death

    def probed(self) -> set[str]:
        return {label for label, _ in self.hosts}


@dataclass(frozen=True)
class _Seen:
    """What the tick's probes told before any one of them is judged."""

    blind: bool  # the fleet's own SSH cannot be told from the boxes': no death counts
    open_: dict[str, str]  # the providers whose breaker is open
    lost: set[str]  # deaths that are no one's path (`_lost`): counted behind a breaker too
    rows: dict[str, Row]


def _listed_now(box: Box | None) -> dict[str, Any]:
    """What the loop keeps of a box's listing at a tick it answered (`Memory.answered`)."""
    return {"uptime_s": None if box is None else box.uptime_s,
            "machine": None if box is None else box.machine_id}


def _key_refused(h: Health) -> bool:
    """Whether the box's SSH failed on the host key it presents (`boxssh.KEY_REFUSED`)."""
    return f"ssh: {KEY_REFUSED}" in h.problems


def _last_seen(row: Row) -> Box:
    """A box its provider says it no longer has, where its row last saw it: to probe its SSH."""
    assert row.provider_id is not None
    return Box(row.provider, row.provider_id, row.label, row.card, row.gpu_count,
               row.usd_per_hour, BoxStatus.GONE, ssh_host=row.ssh_host, ssh_port=row.ssh_port)
