"""Run one schedule: the fleet's real loop (`fleet.ops.loop.Loop`), tick by tick on the
simulated clock, against the simulated cloud, with every invariant checked after every action
the loop takes and after every tick.

- I1: no box the fleet does not own is destroyed.
- I2: no standing box healthy in the ground truth is destroyed, except by a move whose
  replacement was checked well, or where the fleet provably cannot tell (its SSH path to the
  box's provider cut while it holds fewer than two boxes there: a lone box).
- I3: never more live boxes for a role than its roster count plus its moves in flight, and no
  create without the registry row written before it.
- I4: the account's true spend for the day (the world's meters, every box) never passes the
  daily budget.
- I5: no tick fails, and every tick ends within its deadline.
- I6: the disruption budget is never exceeded.
- I7: an operator's `fleet destroy LABEL --gone` is never taken while the key shows the box
  (a box so marked is the operator's word: I2 and I3 leave it out).
- I8: one live box per roster slot, and one live replacement per dead box (the database's
  unique indexes: a second rent for a slot is refused, never made).
- I9: a loop whose lead another loop took acts on nothing at its next tick: no provider change,
  no row changed (its fence refuses); and a loop no one usurped never loses the lead.
- I10: no live row ever re-pins to a host key its box took on with no restart its provider lists
  (a changed key is re-pinned only on the provider's word, never on the fleet's guess).
- L1: once the faults stop, and offers exist within a generous budget, the roster is filled
  and every box converted within `HEAL_TICKS` ticks.
"""

from __future__ import annotations

import contextlib
import random
import secrets
import shutil
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import time_machine
from cloud import Action, Cloud, Killed
from plan import HEAL_TICKS, Event, Plan

from fleet.boxes import lifecycle
from fleet.core import config as config_mod
from fleet.core.boxes import Row
from fleet.core.errors import FleetError, NotLeader
from fleet.ops import destroy, disruption
from fleet.ops import loop as loop_mod
from fleet.ops import rent as rent_mod
from fleet.state.db import open_db
from fleet.state.leader import Leadership
from fleet.state.registry import Registry
from sandbox.catalog import CARDS

START = datetime(2026, 6, 1, 1, 0, tzinfo=UTC)  # one UTC day holds the whole run
INTERVAL_S = 60.0
TICK_DEADLINE_S = 900.0  # simulated seconds one tick may take (its API retries included)
CARD = "RTX 4090"

TOML = """
[fleet]
registry = "{dir}/state/boxes.json"
ssh_key = "{dir}/key"
known_hosts = "{dir}/known_hosts"
daily_budget_usd = {budget}
[loop]
interval_s = {interval}
dead_checks = 2
orphan_grace_s = 180
ready_timeout_s = 300
move_timeout_s = 1800
restart_timeout_s = 600
disruption_window_s = 300
disruption_fraction = 0.5
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
{spread}
[[roster.live]]
provider = "vast"
card = "{card}"
count = 2
[[roster.live]]
provider = "runpod"
card = "{card}"
count = 2
"""


@dataclass
class Outcome:
    plan: Plan
    violations: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)  # what each tick did, for the report

    @property
    def ok(self) -> bool:
        return not self.violations

    def report(self) -> str:
        tail = "\n".join(self.trace[-40:])
        return (f"{self.plan.describe()}\nviolations:\n  " + "\n  ".join(self.violations)
                + f"\nreplay: pytest tests/sim --seed {self.plan.seed}\nlast of the trace:\n"
                + tail)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


class Sim:
    def __init__(self, plan: Plan, root: Path, traveller: Any) -> None:
        self.plan = plan
        self.root = root
        self.traveller = traveller
        self.out = Outcome(plan)
        self.rng = random.Random(f"fleet-sim/{plan.seed}/targets")
        self.cloud = Cloud(plan.seed, time.time, self.sleep)
        self._shape_market()
        self.cfg = self._config(root / "main")
        self.fleets = {"main": self.cfg}
        self.loops: dict[str, loop_mod.Loop] = {}
        self.snapshots: list[bytes] = []
        self.keys_before: dict[str, str | None] = {}  # live rows' keys as a tick began (I10)
        self.kill_at: int | None = None  # kill before (or, negative, after) this mutation
        self.mutations = 0
        self.leading: dict[str, Leadership] = {}
        self.usurped: dict[str, bool] = {}  # fleet -> another loop took its lead this tick
        self.disruptions: list[tuple[float, str]] = []  # destroys on the loop's judgement
        # boxes an operator said were gone while the key could not see them: their word, not
        # the fleet's judgement (the box may be swept as an orphan, or run beside its re-rent)
        self.said_gone: set[str] = set()
        self.cloud.after_action = self.on_action
        self.cloud.before_mutation = self.on_mutation
        self._person_boxes()

    # -- set-up --------------------------------------------------------------------------

    def _shape_market(self) -> None:
        """Every host an RTX 4090 host on the admitted driver: a host death takes capacity
        away, never all of it (L1 asks for a roster filled where offers exist)."""
        card = next(c for c in CARDS if c.display == CARD)
        for machines in self.cloud.world.machines.values():
            for i, m in enumerate(machines):
                m.card, m.driver, m.actual_driver = card, "580.95.05", "580.95.05"
                m.direct_port_count, m.reliability = 500, 0.999
                m.datacenter = i % 2 == 0  # both tiers offered: a re-rent keeps its own

    def _config(self, where: Path) -> config_mod.Config:
        where.mkdir(parents=True, exist_ok=True)
        (where / "key").write_text("a key\n")
        (where / "key.pub").write_text("ssh-ed25519 AAAA fleet\n")
        text = TOML.format(dir=where, budget=self.plan.budget_usd, interval=INTERVAL_S,
                           spread="" if self.plan.spread else "spread = false",
                           card=CARD)
        return config_mod.parse(tomllib.loads(text), where / "fleet.toml")

    def _person_boxes(self) -> None:
        w = self.cloud.world
        for n in range(self.plan.person_boxes):
            provider = ("vast", "runpod")[n % 2]
            machine = next(m for m in w.machines[provider] if m.free_gpus)
            label = ("live-debug", "web1")[n % 2]  # a role's prefix; a name of a person's own
            w.create(provider, machine, 1, image="img", label=label, env={}, tcp_ports=[22],
                     disk_gb=10, gpu_rate=0.05)
        self.cloud.step()

    def loop(self, fleet: str = "main") -> loop_mod.Loop:
        """The fleet's loop, leading: a loop started (again) campaigns, as `fleet loop` does."""
        if fleet not in self.loops:
            old = self.leading.pop(fleet, None)
            if old is not None:
                old.resign()  # its process is gone: so is its lock
            leading = self.leading[fleet] = Leadership(open_db(self.fleets[fleet].registry),
                                                       holder=f"sim {fleet}")
            fence = leading.campaign()
            assert fence is not None, "no other loop holds the lead in the simulation"
            self.loops[fleet] = loop_mod.Loop(
                self.fleets[fleet], self.cloud.providers(fleet), echo=lambda _: None,
                converge_fn=self.cloud.converge, check_fn=self.cloud.check, peers_fn=None,
                fence=fence)
        return self.loops[fleet]

    # -- the clock -----------------------------------------------------------------------

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        self.traveller.shift(max(0.0, seconds))
        self.cloud.step()

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> Outcome:
        by_tick: dict[int, list[Event]] = {}
        for e in self.plan.events:
            by_tick.setdefault(e.tick, []).append(e)
        for n in range(1, self.plan.ticks + 1):
            for e in by_tick.get(n, []):
                self.fire(e)
            self.keys_before = {r.label: r.host_key for r in self.rows().values() if r.live}
            for fleet in list(self.fleets):
                self.tick(n, fleet)
            self.after_tick(n)
            if len(self.out.violations) > 0:
                break
            self.sleep(INTERVAL_S)
        if self.out.ok:
            self.check_healed()
        return self.out

    def tick(self, n: int, fleet: str) -> None:
        started = self.now()
        lp = self.loop(fleet)
        usurped = self.usurped.pop(fleet, False)
        if usurped:
            before, acted = self.rows(fleet), self.mutations
        try:
            t = lp.tick()
            self.out.trace.append(f"t{n} {fleet}: " + " | ".join(t.actions))
            if usurped:
                self.violate(f"I9: tick {n} of {fleet} ran whole though another loop led")
        except NotLeader as e:
            self.out.trace.append(f"t{n} {fleet}: {e}")
            if not usurped:
                self.violate(f"I9: tick {n} of {fleet} lost the lead no one took: {e}")
            elif self.mutations != acted or self.rows(fleet) != before:
                self.violate(f"I9: tick {n} of {fleet} acted after another loop took the lead "
                             f"({self.mutations - acted} provider changes)")
            del self.loops[fleet]  # `fleet loop` campaigns again, a new loop
        except Killed:
            self.out.trace.append(f"t{n} {fleet}: killed after {self.mutations} changes")
            self.kill_at = None
            del self.loops[fleet]  # started again from its files
        except Exception as e:  # noqa: BLE001 - any failure of a tick is a finding
            self.violate(f"I5: tick {n} of {fleet} failed: {type(e).__name__}: {e}")
        took = self.now() - started
        if took > TICK_DEADLINE_S:
            self.violate(f"I5: tick {n} of {fleet} took {took:.0f} s of simulated time")

    def fire(self, e: Event) -> None:
        w, truth = self.cloud.world, self.cloud.truth
        ours = [i for i in self.fleet_instances()
                if i.phase == "running" and i.machine.dead_at is None]
        target = self.rng.choice(ours) if ours else None
        self.out.trace.append(f"event {e}" + (f" on {target.label}" if target else ""))
        if e.kind == "host_death" and target is not None:
            w.host_death(target.machine)
        elif e.kind == "container_restart" and target is not None:
            w.restart_container(target)
        elif e.kind == "hang" and target is not None:
            truth.hung.add(target.key)
        elif e.kind == "heal":
            truth.hung.clear()
        elif e.kind == "cut":
            truth.cut.add(e.arg)
        elif e.kind == "restore":
            truth.cut.clear()
        elif e.kind == "blind":
            truth.blind.add(e.arg)
        elif e.kind == "see":
            truth.blind.clear()
        elif e.kind in ("rate_limit", "server_error"):
            w.faults.add(e.kind, e.arg, count=self.rng.randint(1, 6))
        elif e.kind in ("create_timeout", "no_capacity"):
            w.faults.add(e.kind, e.arg, count=1)
        elif e.kind == "listing_gap" and target is not None and target.provider == "vast":
            w.faults.add("listing_gap", "vast", count=self.rng.randint(1, 4), drop=target.label)
        elif e.kind == "restore_registry" and self.snapshots:
            back = self.snapshots[max(0, len(self.snapshots) - 1 - self.rng.randint(1, 6))]
            with open_db(self.cfg.registry).write() as tx:  # the boxes as they were then
                tx.q("DELETE FROM boxes")
                tx.many("INSERT INTO boxes (label, seq, provider, provider_id, slot, rerent_of, "
                        "move_of, live, doc) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", back)
        elif e.kind == "clock_step":
            self.sleep(float(e.arg))
        elif e.kind == "kill":
            self.kill_at = self.mutations + int(e.arg)
        elif e.kind == "kill_after":
            self.kill_at = -(self.mutations + int(e.arg))
        elif e.kind == "usurp":
            with open_db(self.cfg.registry).write() as tx:  # another loop's takeover
                tx.q("UPDATE leader SET epoch = epoch + 1, holder = 'another loop'")
            # a loop that runs now must act on nothing more; one started later leads anew
            self.usurped["main"] = "main" in self.loops
        elif e.kind == "mark_gone" and target is not None:
            self.mark_gone(target)
        elif e.kind == "rekey" and target is not None:
            self.out.trace.append(f"{target.label} serves {self.cloud.rekey(target)}")
        elif e.kind == "second_registry" and "second" not in self.fleets:
            cfg = self._config(self.root / "second")
            try:  # as `fleet loop` does before it starts
                rent_mod.other_fleets(Registry(cfg.registry), self.cloud.providers("second"))
            except FleetError as refused:
                self.out.trace.append(f"second registry refused: {refused}")
                return
            self.fleets["second"] = cfg

    def mark_gone(self, target: Any) -> None:
        """`fleet destroy LABEL --gone` on a live fleet box. I7: it is never taken while the
        fleet's key shows the box (its id, or its label): only an account the key cannot see
        leaves room for the operator's word."""
        try:
            destroy.mark_gone(Registry(self.cfg.registry), self.cloud.providers("main"),
                              target.label)
        except FleetError as refused:
            self.out.trace.append(f"--gone refused: {refused}")
            return
        self.said_gone.add(target.key)
        if target.provider not in self.cloud.truth.blind and target.phase != "destroyed":
            self.violate(f"I7: {target.label} ({target.key}) marked gone while the key shows "
                         "it")

    def on_mutation(self) -> None:
        if self.kill_at is not None and self.kill_at >= 0 and self.mutations >= self.kill_at:
            raise Killed

    # -- invariants ------------------------------------------------------------------------

    def violate(self, what: str) -> None:
        self.out.violations.append(f"{what} (simulated {self.now() - START.timestamp():.0f} s)")

    def rows(self, fleet: str = "main") -> dict[str, Row]:
        try:
            return {r.label: r for r in Registry(self.fleets[fleet].registry).rows()}
        except FleetError:
            return {}

    def fleet_instances(self) -> list[Any]:
        return [i for k, i in sorted(self.cloud.world.instances.items())
                if self.cloud.truth.owners.get(k) == "main" and i.phase != "destroyed"]

    def on_action(self, a: Action) -> None:
        self.mutations += 1
        rows = self.rows(a.fleet)
        if a.kind == "create":
            if a.label not in rows:
                self.violate(f"I3: {a.fleet} created {a.label} ({a.key}) with no registry row "
                             "written before it")
        else:
            self._check_destroy(a, rows)
        if self.kill_at is not None and self.kill_at < 0 and self.mutations > -self.kill_at:
            raise Killed

    def _check_destroy(self, a: Action, rows: dict[str, Row]) -> None:
        truth, inst = self.cloud.truth, self.cloud.world.instances[a.key]
        if truth.owners.get(a.key) != a.fleet:
            self.violate(f"I1: {a.fleet} destroyed {a.label} ({a.key}), which "
                         f"{truth.owners.get(a.key) or 'a person'} made")
            return
        row = next((r for r in rows.values() if r.provider_id == inst.id
                    and r.provider == inst.provider), rows.get(a.label))
        # a box serving a key it took on with no restart listed is no longer the box pinned
        was_healthy = a.phase_before == "running" and inst.machine.dead_at is None \
            and a.key not in truth.hung and a.key in truth.converted \
            and self.cloud.served_key(inst) not in truth.unvouched
        moved = row is not None and any(
            r.move_of == row.label and r.live and self.cloud.healthy(
                self.cloud.instance(r.provider, r.provider_id)) for r in rows.values())
        # the documented case the fleet cannot tell apart: its path to the provider cut while
        # one box there could tell it so (others: a create never sent, a dead host, a hang)
        lone = inst.provider in truth.cut and sum(
            1 for r in rows.values() if r.live and r.provider == inst.provider
            and self.cloud.alive(self.cloud.instance(r.provider, r.provider_id))) < 2
        if was_healthy and not moved and not lone and a.key not in self.said_gone:
            self.violate(f"I2: {a.fleet} destroyed {a.label} ({a.key}), healthy in the ground "
                         f"truth (row: {row.status if row else 'none'})")
        judged = a.phase_before not in ("exited", "stopped") and (
            row is None or (row.standing and not row.move_of))
        if judged:
            self.disruptions.append((self.now(), a.label))
            window = self.cfg.loop.disruption_window_s
            recent = [lb for at, lb in self.disruptions if self.now() - at < window]
            most = disruption.allowance(4, self.cfg.loop.disruption_fraction)
            if len(recent) > most:
                self.violate(f"I6: {len(recent)} boxes destroyed on the loop's judgement within "
                             f"{window:g} s ({', '.join(recent)}), more than {most}")

    def after_tick(self, n: int) -> None:
        with open_db(self.cfg.registry).read() as tx:
            self.snapshots.append(tx.q("SELECT label, seq, provider, provider_id, slot, "
                                       "rerent_of, move_of, live, doc FROM boxes"))
        rows = self.rows()
        self.check_slots(rows)
        for r in rows.values():
            if not r.live or r.host_key not in self.cloud.truth.unvouched:
                continue
            before = self.keys_before.get(r.label)
            if before is None:
                # a first pin (of a box rented, or of a row a restored registry holds without
                # a key) trusts the key its box serves: from then on that is the box
                self.cloud.truth.unvouched.discard(r.host_key)
            elif before != r.host_key:  # a re-pin
                self.violate(f"I10: {r.label} pins {r.host_key}, a key its box took on with no "
                             f"restart its provider lists, in place of {before}")
        live = [i for i in self.fleet_instances() if i.key not in self.said_gone]
        moving = sum(1 for r in rows.values() if r.live and r.move_of
                     and (old := rows.get(r.move_of)) is not None and old.live)
        if len(live) > 4 + moving:
            self.violate(f"I3: {len(live)} live boxes for a roster of 4 ({moving} moves in "
                         f"flight): {', '.join(sorted(i.label for i in live))}")
        spent = self.spent_today()
        if spent > self.plan.budget_usd + 1e-6:
            self.violate(f"I4: the account spent ${spent:.2f} today, past the budget "
                         f"${self.plan.budget_usd:g}")

    def check_slots(self, rows: dict[str, Row]) -> None:
        """I8: one live box per roster slot, one live replacement per dead box."""
        live = [r for r in rows.values() if r.live]
        for what, key in (("slot", "slot"), ("replacement of", "rerent_of")):
            seen: dict[str, str] = {}
            for r in live:
                v = getattr(r, key)
                if not v:
                    continue
                if v in seen:
                    self.violate(f"I8: two live boxes for {what} {v}: {seen[v]} and {r.label}")
                seen[v] = r.label

    def spent_today(self) -> float:
        day = self.now() - (self.now() % 86400)
        total = 0.0
        for key in self.cloud.world.instances:
            for seg in self.cloud.world.ledger.segments(key):
                total += seg.hours_within(day, self.now()) * (seg.gpu_rate + seg.storage_rate)
        return total

    def check_healed(self) -> None:
        if self.plan.budget_usd < 200:
            return  # a tight budget may rightly leave the roster short
        rows = self.rows()
        well = [r for r in rows.values() if r.live and r.host_key
                and self.cloud.healthy(self.cloud.instance(r.provider, r.provider_id))]
        if len(well) < 4:
            self.violate(f"L1: {HEAL_TICKS}+ ticks after the faults stopped, {len(well)} of 4 "
                         "boxes are standing and well: "
                         + ", ".join(f"{r.label}={r.status}" for r in rows.values() if r.live))


def _seeded_token_hex(seed: int) -> Callable[..., str]:
    """`secrets.token_hex` from the seed: fleet ids and labels replay exactly."""
    rng = random.Random(f"fleet-sim/{seed}/tokens")
    return lambda nbytes=32: rng.randbytes(nbytes if nbytes is not None else 32).hex()


def run(plan: Plan) -> Outcome:
    # the state database syncs at every commit: on a RAM disk where there is one
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(prefix="fleet-sim-", dir=shm if shm.is_dir() else None))
    try:
        with contextlib.ExitStack() as stack:
            traveller = stack.enter_context(time_machine.travel(START, tick=False))
            stack.enter_context(_patched(secrets, "token_hex", _seeded_token_hex(plan.seed)))
            stack.enter_context(_patched(rent_mod, "wait_ready",
                                         _ready_at_once(rent_mod.wait_ready)))
            sim = Sim(plan, root, traveller)
            stack.enter_context(_patched(lifecycle, "fetch_host_key", sim.cloud.host_key))
            return sim.run()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _ready_at_once(real: Callable[..., Any]) -> Callable[..., Any]:
    """`rent.wait_ready` looking once, not polling a wall clock: a box not ready yet is an
    unfinished rent the next tick resumes."""
    def wait_ready(cfg: Any, reg: Any, providers: Any, labels: list[str], **_: Any) -> Any:
        return real(cfg, reg, providers, labels, timeout_s=0.0, poll_s=0.0)
    return wait_ready


def shorten(plan: Plan, fails: Callable[[Plan], bool]) -> Plan:
    """The schedule with every event left out whose absence still fails (one pass)."""
    i = 0
    while i < len(plan.events):
        shorter = plan.without(i)
        if fails(shorter):
            plan = shorter
        else:
            i += 1
    return plan
