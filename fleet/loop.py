"""`fleet loop`: keep the standing fleet up without anyone watching.

Each tick:
1. Lists every provider's boxes against the registry (`fleet.sync.view`). A provider that
   fails is reported and its boxes are not judged this tick: an API error is never death.
2. Checks every running standing box at once (the agent's status through one SSH command
   each, as `fleet check`). A box is *dead* on a check when its provider lists it as exited
   (or no longer lists it), or SSH does not answer while the provider says it runs. Dead on
   `dead_checks` consecutive ticks (fleet.toml `[loop]`, default 2), it is destroyed where the
   provider still lists it (its row marked destroyed, or vanished when no provider lists it)
   and owed for a re-rent in the same shape: provider, card, GPU count and role (so the same
   image, driver pin, allowed CUDA and p2p port), labelled `<label>-r<n>`, `rerent_of` set.
   A box whose agent refuses admission (a driver other than the pinned one, an unqualified
   GPU: RunPod advertises no driver, so admission after boot is the only guard) is *unfit*,
   counted like a dead one: kept, it would bill for a card that never works. Its machine
   (where the provider names it) is passed over by the re-rents for a day (`loop.json`).
   A box whose SSH answers but whose agent is down is converged again (its agent back).
3. Rents what is owed: the re-rents, and the roster's wanted boxes (`[[roster.ROLE]]`) that
   no live box fills, cheapest admissible offer first, each within the daily budget (the
   budget check and the registry row are one locked step). What cannot be rented stays owed
   with the reason: no capacity, no admissible offer, over budget, provider refusing.
4. Converts what it rented, and the boxes whose agent was down, with the standing deploy,
   then verifies them with the testinfra checks: only then is a replacement done.
5. Reports orphans (provider boxes with a label of this fleet's roles that the registry
   lacks) and destroys them once seen for `orphan_grace_s`, unless told not to.
6. Writes the fleet page (index.html and fleet.json, each replaced whole).

Boxes behind their wanted release are reported; the loop never moves binaries. What the loop
remembers between ticks (dead counts, owed boxes, orphans first seen) is in `loop.json`
beside the registry; `loop.lock` keeps a second loop off the same registry.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from fleet import bills, pyinfra_run
from fleet import offers as offers_mod
from fleet import rent as rent_mod
from fleet.check import Health
from fleet.config import Config, Role
from fleet.errors import (
    BudgetExceeded,
    FleetError,
    NoCapacity,
    OfferGone,
    ProviderError,
    UsageError,
)
from fleet.fileutil import write_atomic
from fleet.inventory import Built, host_data
from fleet.page import Owed, is_standing
from fleet.providers.base import Box, Provider
from fleet.registry import Registry, Row, now_iso, parse_iso
from fleet.sshkeys import write_known_hosts
from fleet.sync import View, view

RERENT = re.compile(r"^(?P<base>.+?)-r(?P<n>\d+)$")


@dataclass
class Owe:
    """A wanted box the loop still has to rent: a roster shortfall or a dead box's re-rent."""

    role: str
    provider: str
    card: str
    gpus: int
    since: str
    reason: str = "not tried yet"
    rerent_of: str | None = None
    cloud: str | None = None  # a re-rent keeps the dead box's tier

    def shape(self) -> tuple[str, str, str, int]:
        return (self.role, self.provider, self.card, self.gpus)

    def for_page(self) -> Owed:
        why = self.reason if not self.rerent_of else f"{self.reason} (replaces {self.rerent_of})"
        return Owed(self.role, self.provider, self.card, self.gpus, why, self.since)


@dataclass
class Memory:
    """What a tick leaves for the next (loop.json)."""

    tick: int = 0
    dead: dict[str, int] = field(default_factory=dict)  # label -> consecutive dead checks
    rerents: list[Owe] = field(default_factory=list)  # dead boxes not replaced yet
    owed: list[Owe] = field(default_factory=list)  # the last tick's owed boxes, as reported
    orphans: dict[str, str] = field(default_factory=dict)  # "provider/id" -> first seen
    # "provider/machine" -> when a box on it was found unfit: its offers are passed over
    unfit_machines: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> Memory:
        try:
            d = json.loads(path.read_text())
            return cls(int(d["tick"]), dict(d["dead"]), [Owe(**o) for o in d["rerents"]],
                       [Owe(**o) for o in d["owed"]], dict(d["orphans"]),
                       dict(d.get("unfit_machines", {})))
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise FleetError(f"{path}: the loop's memory is not readable ({e}); move it aside "
                             "to start afresh") from None

    def save(self, path: Path) -> None:
        write_atomic(path, json.dumps(asdict(self), indent=1) + "\n")


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
    orphans: list[str] = field(default_factory=list)
    provider_errors: list[str] = field(default_factory=list)
    converge_s: float = 0.0  # of took_s: the deploy and checks of what was converged
    took_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["owed"] = [o.for_page().to_dict() | {"rerent_of": o.rerent_of} for o in self.owed]
        return d

    def summary(self) -> str:
        return (f"tick {self.number}: {len(self.well)} well, {len(self.problems)} with "
                f"problems, {len(self.dead)} dead, {len(self.replaced)} replaced, "
                f"{len(self.owed)} owed, {len(self.orphans)} orphans, "
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


def converge(cfg: Config, labels: list[str]) -> str | None:
    """The standing deploy on `labels`, then the testinfra checks on them; None when both
    passed, else what failed (one line). Each run is bounded by `converge_timeout_s`: a hung
    deploy must not stall the loop, whose other boxes still need their ticks."""
    env = pyinfra_run.env(cfg, FLEET_INFRA_LIMIT=",".join(labels))
    deploy = pyinfra_run.argv("deploys/standing.py", labels)
    r = _bounded(deploy, env, cfg.loop.converge_timeout_s)
    if isinstance(r, str):
        return f"the standing deploy {r}"
    if r.returncode != 0:
        return f"the standing deploy failed: {_last_line(r.stderr or r.stdout)}"
    checks = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/infra"]
    r = _bounded(checks, env, cfg.loop.converge_timeout_s)
    if isinstance(r, str):
        return f"the testinfra checks {r}"
    if r.returncode != 0:
        failed = [ln for ln in r.stdout.splitlines() if ln.startswith(("FAILED", "ERROR"))]
        return f"the testinfra checks failed: {(failed or [_last_line(r.stdout)])[0]}"
    return None


def _bounded(argv: list[str], env: dict[str, str],
             timeout_s: float) -> subprocess.CompletedProcess[str] | str:
    """Run `argv` in its own process group; past `timeout_s` the whole group (pyinfra's or
    pytest's SSH children too) is killed and the answer is a sentence, not a result."""
    p = subprocess.Popen(argv, cwd=pyinfra_run.REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return f"ran past {timeout_s:g} s and was killed"
    return subprocess.CompletedProcess(argv, p.returncode, out, err)


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


class Loop:
    def __init__(self, cfg: Config, providers: Mapping[str, Provider], *,
                 destroy_orphans: bool = True, page_dir: Path | None = None,
                 echo: Callable[[str], None] = print, converge_fn: Converge = converge,
                 check_fn: Callable[[Config, Built], list[Health]] | None = None) -> None:
        from fleet import check as check_mod

        self.cfg, self.providers = cfg, dict(providers)
        self.reg = Registry(cfg.registry)
        self.memory_path = cfg.registry.parent / "loop.json"
        self.destroy_orphans = destroy_orphans
        self.page_dir = page_dir
        self.echo = echo
        self.converge_fn = converge_fn
        self.check_fn = check_fn or check_mod.check

    # -- one tick -------------------------------------------------------------------------

    def tick(self) -> Tick:
        mem = Memory.load(self.memory_path)
        mem.tick += 1
        t = Tick(mem.tick, now_iso())
        started = time.monotonic()
        v = view(self.reg, self.providers)
        failed = set()
        for e in v.failures:
            failed.add(e.provider)
            self._act(t, f"provider {e.provider}: {e} (its boxes are not judged this tick)")
            t.provider_errors.append(str(e))
        self._note_stops(v)
        read = bills.refresh(self.cfg.registry, self.providers)  # for the rents and the page
        for name, why in read.errors.items():
            self._act(t, f"bills: {name} gave none ({why}); its boxes are estimated")
        health = self._judge(t, mem, v, failed)
        self._replace_dead(t, mem, v)
        self._forget_unfit(mem)
        fresh = self._rent_owed(t, mem)
        self._converge(t, fresh)
        self._orphans(t, mem, v, failed)
        mem.owed = t.owed
        mem.save(self.memory_path)
        try:
            self._page(t, health)
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
        """Dead votes, agents to bring back, problems to report; returns the checks made."""
        listed = {row.label: box for row, box in v.matched}
        gone = {r.label for r in v.gone}
        hosts, checked = [], []
        write_known_hosts(self.cfg.known_hosts, self.reg.rows())
        for row in self._standing_rows():
            if row.provider in failed:
                continue  # the provider did not answer: nothing can be told, nothing changes
            box = listed.get(row.label)
            if row.label in gone:
                t.dead[row.label] = "no provider lists it any more"
            elif box is not None and box.status != "running":
                t.dead[row.label] = f"{row.provider} lists it as {box.status}"
            elif box is not None:
                hosts.append((row.label, host_data(self.cfg, row, box)))
        for row in v.gone:  # one-shot and other boxes: marked vanished, never re-rented
            if row.provider not in failed and not is_standing(self.cfg, row):
                t.dead[row.label] = "no provider lists it any more"
        health = self.check_fn(self.cfg, Built(groups={"standing": hosts})) if hosts else []
        for h in health:
            if not h.ssh:
                t.dead[h.label] = "SSH does not answer while its provider says it runs"
                continue
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
        for label in list(mem.dead):
            if label not in t.dead:
                del mem.dead[label]  # alive again, or no longer ours to judge
        for label, why in sorted(t.dead.items()):
            mem.dead[label] = mem.dead.get(label, 0) + 1
            word, _, why = why.partition(": ") if why.startswith("unfit") else ("dead", "", why)
            self._act(t, f"{label}: {word} ({why}), check {mem.dead[label]} of "
                         f"{self.cfg.loop.dead_checks}")
        return checked

    def _replace_dead(self, t: Tick, mem: Memory, v: View) -> None:
        listed = {row.label: box for row, box in v.matched}
        for label, count in sorted(mem.dead.items()):
            if count < self.cfg.loop.dead_checks:
                continue
            row = self.reg.get(label)
            if row is None or not row.live:
                del mem.dead[label]
                continue
            box = listed.get(label)
            try:
                if box is not None:
                    self.providers[row.provider].destroy(box.box_id)
                    if self.providers[row.provider].box(box.box_id) is not None:
                        raise ProviderError(row.provider, "destroy",
                                            f"box {box.box_id} is still listed")
                    self.reg.mark_destroyed(label)
                    self._act(t, f"{label}: destroyed (dead or unfit on {count} checks)")
                else:
                    self.reg.mark_destroyed(label, "vanished")
                    self._act(t, f"{label}: marked vanished (no provider lists it)")
            except (ProviderError, KeyError) as e:
                self._act(t, f"{label}: destroying the dead box failed ({e}); tried again "
                             "next tick")
                continue
            del mem.dead[label]
            if t.dead.get(label, "").startswith("unfit") and box is not None and box.machine_id:
                mem.unfit_machines[f"{row.provider}/{box.machine_id}"] = now_iso()
            if is_standing(self.cfg, row):
                mem.rerents.append(Owe(row.role, row.provider, row.card, row.gpu_count,
                                       now_iso(), rerent_of=label, cloud=row.cloud))

    # -- the owed roster --------------------------------------------------------------------

    def owed(self, mem: Memory) -> list[Owe]:
        """Re-rents first, then each roster entry's shortfall (a pending re-rent fills one)."""
        live = [r for r in self.reg.rows() if r.live]
        out = list(mem.rerents)
        before = {(o.shape(), o.rerent_of): o.since for o in mem.owed}
        for w in self.cfg.roster:
            if self.cfg.role(w.role).kind != "standing":
                continue  # one-shot boxes are rented per job (`fleet run`), never kept up
            shape = (w.role, w.provider, w.card, w.gpus)
            have = sum(1 for r in live if (r.role, r.provider, r.card, r.gpu_count) == shape)
            pending = sum(1 for o in mem.rerents if o.shape() == shape)
            for _ in range(max(0, w.count - have - pending)):
                out.append(Owe(*shape, since=before.get((shape, None), now_iso())))
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
        if rented:
            try:
                rent_mod.wait_ready(self.cfg, self.reg, self.providers, rented)
            except FleetError as e:
                self._act(t, f"waiting for SSH on {', '.join(rented)}: {e}")
        return rented

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
                                label=self._label(o), rerent_of=o.rerent_of)
        except BudgetExceeded as e:
            o.reason = f"over budget: {e}"
        except (NoCapacity, OfferGone) as e:  # every offer tried went or had no machine
            o.reason = f"no capacity: {e}"
        except ProviderError as e:
            o.reason = f"provider refusing: {e}"
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
        if not o.rerent_of:
            return None  # a roster box gets a generated label
        m = RERENT.match(o.rerent_of)
        base = m.group("base") if m else o.rerent_of
        taken = {r.label for r in self.reg.rows()}
        n = 1
        while f"{base}-r{n}" in taken:
            n += 1
        return f"{base}-r{n}"

    # -- conversion, orphans, the page ------------------------------------------------------

    def _converge(self, t: Tick, fresh: list[str]) -> None:
        labels = sorted(set(fresh) | set(t.converged))
        ready = [lb for lb in labels if (r := self.reg.get(lb)) is not None and r.host_key]
        t.converged = []
        if not ready:
            return
        started = time.monotonic()
        failure = self.converge_fn(self.cfg, ready)
        t.converge_s = round(time.monotonic() - started, 2)
        if failure:
            self._act(t, f"converging {', '.join(ready)}: {failure} (tried again next tick)")
            return
        t.converged = ready
        self._act(t, f"converged and checked: {', '.join(ready)}")

    def _ours(self, b: Box) -> bool:
        return any((b.label or "").startswith(f"{role}-") for role in self.cfg.roles)

    def _orphans(self, t: Tick, mem: Memory, v: View, failed: set[str]) -> None:
        now = time.time()
        seen = {}
        grace = self.cfg.loop.orphan_grace_s
        for b in v.orphans:
            if not self._ours(b):
                continue
            key = f"{b.provider}/{b.box_id}"
            first = mem.orphans.get(key, now_iso())
            seen[key] = first
            age = now - _epoch(first)
            t.orphans.append(f"{b.label} ({key})")
            if age < grace or not self.destroy_orphans:
                left = "" if not self.destroy_orphans else f", destroyed in {grace - age:.0f} s"
                self._act(t, f"orphan {b.label} ({key}, ${b.usd_per_hour:.3f}/h): not in the "
                             f"registry{left}")
                continue
            try:
                self.providers[b.provider].destroy(b.box_id)
            except ProviderError as e:
                self._act(t, f"orphan {b.label} ({key}): destroy failed ({e})")
                continue
            seen.pop(key)
            self._act(t, f"orphan {b.label} ({key}): destroyed after {age:.0f} s")
        # a provider that did not answer keeps its orphans' first-seen times
        mem.orphans = seen | {k: v for k, v in mem.orphans.items()
                              if k.split("/", 1)[0] in failed}

    def _page(self, t: Tick, health: list[Health]) -> None:
        from fleet import page, watchdog

        target = self.page_dir or self.cfg.registry.parent / "page"
        rows = self.reg.rows()
        now = datetime.now(UTC)
        billed = bills.billed(rows, bills.load(self.cfg.registry), now)
        watched = watchdog.watch(self.cfg, self.reg) \
            if any(r.live and r.kind == "oneshot" for r in rows) else []
        data = page.build(self.cfg, rows, health, watched, now, billed=billed,
                          owed=[o.for_page() for o in t.owed],
                          interval_s=self.cfg.loop.interval_s,
                          check_error="; ".join(t.provider_errors) or None)
        page.write(target, data)


def _epoch(iso: str) -> float:
    return parse_iso(iso).timestamp()


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
        if once:
            return
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
