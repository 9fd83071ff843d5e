"""Standing boxes spread across machines, on real sandbox boxes: `fleet loop` fills a roster of
four Vast boxes on a market whose cheapest offer sits on one machine with room for all four,
keeps the spread when a host dies, shares a machine (and says why) only when no other is
offered, and moves the shared box later, destroying it only once its replacement is synced.

The steps build on each other (one roster, one market), so they run as one test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.core.boxes import Row
from sandbox import fleet_toml

ROSTER = (("vast", "RTX 4090", 4),)
DRIVER = "580.95.05"  # the live role's admitted driver (sandbox/fleet_toml.py)


def config(state: Path) -> str:
    return fleet_toml.render(state, budget=500, loop=LOOP, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    # 64 machines a provider: enough admissible RTX 4090 machines on Vast to spread 4 boxes
    # and replace one
    yield from sandboxed(tmp_path_factory, "spread", config, boxes=4, machines=64)


def admissible(fleet: Loopy) -> list[dict[str, Any]]:
    with fleet.control() as c:
        return sorted((m for m in c.machines() if m["provider"] == "vast"
                       and m["card"] == "RTX 4090" and m["driver"] == DRIVER
                       and m["direct_port_count"] and not m["dead"]),
                      key=lambda m: m["price_per_gpu"])


def placed(fleet: Loopy) -> dict[str, str]:
    """label -> the machine the sandbox put each live box on."""
    with fleet.control() as c:
        return {i["label"]: str(i["machine_id"]) for i in c.instances()
                if i["phase"] not in ("destroyed",)}


def replaced(fleet: Loopy, old: Row) -> Row:
    """Tick until the dead box's replacement is converted and the roster settled again."""
    def done() -> Row | None:
        fleet.tick()
        return next((r for r in fleet.live() if r.rerent_of == old.label and r.standing),
                    None)
    new = wait_for(f"{old.label} replaced", done, timeout=600, poll_s=1)
    fleet.settle()
    return new


def test_four_boxes_on_four_machines_kept_apart_shared_only_when_alone_and_moved_later(
        fleet: Loopy) -> None:
    machines = admissible(fleet)
    big = next(m for m in machines if m["free_gpus"] >= 4)
    with fleet.control() as c:  # the cheapest offer, with room for the whole roster
        c.shape_machine("vast", big["machine_id"], price_per_gpu=0.05)
        # one tier (Vast's datacenter or community) on offer: a re-rent keeps its box's tier
        for m in machines:
            if m["datacenter"] != big["datacenter"]:
                c.shape_machine("vast", m["machine_id"], other_tenants=m["free_gpus"])
    machines = [m for m in machines if m["datacenter"] == big["datacenter"]]
    assert len(machines) >= 6, machines  # four apart, a replacement, a free one later
    cheap = f"vast machine {big['machine_id']}"

    rows = fleet.settle()
    places = {r.label: r.place for r in rows}
    assert len(set(places.values())) == 4 and cheap in places.values(), places
    on = placed(fleet)
    assert {label: f"vast machine {on[label]}" for label in places} == places

    # a host dies: its replacement goes to a machine none of the other three holds
    old = next(r for r in rows if r.place != cheap)
    fleet.fleet("sandbox", "fault", "host_death", old.label)
    new = replaced(fleet, old)
    live = fleet.live()
    assert len(live) == 4 and len({r.place for r in live}) == 4, [r.place for r in live]
    assert new.place not in (old.place, *[r.place for r in live if r.label != new.label])
    assert new.note is None

    # only the cheap machine left: the next replacement shares it, and its row says why
    others = [m for m in admissible(fleet) if m["machine_id"] != big["machine_id"]
              and m["datacenter"] == big["datacenter"]]
    with fleet.control() as c:
        for m in others:
            c.shape_machine("vast", m["machine_id"], other_tenants=m["free_gpus"])
    victim = next(r for r in fleet.live() if r.place != cheap)
    fleet.window_passed()  # the disruption budget (1 an hour for 4) whole again
    fleet.fleet("sandbox", "fault", "host_death", victim.label)
    shared = replaced(fleet, victim)
    holder = next(r.label for r in fleet.live() if r.place == cheap and r.label != shared.label)
    assert shared.place == cheap
    assert shared.note == (f"shares {cheap} with {holder}: every offer was on a place the "
                           "role already holds")
    roster = json.loads(fleet.fleet("roster", "--json").stdout)
    assert roster["places"][cheap] == 2, roster["places"]
    page = json.loads((fleet.tmp / "state" / "page" / "fleet.json").read_text())
    assert page["places"][cheap] == 2, page.get("places")

    # a machine comes free: the shared box moves there; it is destroyed only once its mover
    # is converted, checked well and synced
    holding = {r.place for r in fleet.live()}
    alive = {m["machine_id"] for m in admissible(fleet)}  # the victim's host is dead now
    free = next(m for m in others if m["machine_id"] in alive
                and f"vast machine {m['machine_id']}" not in holding)
    with fleet.control() as c:
        c.shape_machine("vast", free["machine_id"], other_tenants=0)
    fleet.window_passed()  # the move's destroy of the shared box spends the budget too

    def moved() -> bool:
        t = fleet.tick()
        mover = next((r for r in fleet.live() if r.move_of == shared.label), None)
        if mover is not None and fleet.rows()[shared.label].live:
            assert not any(f"{shared.label}: destroyed" in a for a in t["actions"])
        return not fleet.rows()[shared.label].live
    wait_for(f"{shared.label} moved", moved, timeout=600, poll_s=1)
    gone = fleet.rows()[shared.label]
    mover = next(r for r in fleet.rows().values() if r.move_of == shared.label)
    assert gone.status == "destroyed" and gone.note and gone.note.startswith(
        f"moved to {mover.label}")
    assert mover.live and mover.standing and mover.place == f"vast machine {free['machine_id']}"
    live = fleet.settle()
    assert len(live) == 4 and len({r.place for r in live}) == 4
    checked = fleet.infra(mover.label)
    assert checked.returncode == 0, checked.stdout[-3000:]
