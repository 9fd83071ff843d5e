"""Owed ports on real sandbox boxes: while no Vast host maps a p2p port, the loop rents the
roster's Vast box from an offer without enough direct ports; its node only dials out and is
reported star-only and owed a port. Once a host that maps one is offered, the loop rents the
replacement there, converts it, and destroys the old box only in a tick that checked the new
node well, synced and dialled by two peers. No synced node is lost to gain a port.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.state import last_tick as last_tick_mod
from sandbox import fleet_toml

ROSTER = (("vast", "RTX 4090", 1), ("runpod", "RTX 4090", 2))
DRIVER = "580.95.05"  # the live role's admitted driver (sandbox/fleet_toml.py)


def config(state: Path) -> str:
    return fleet_toml.render(state, budget=500, loop=LOOP, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "ports", config, boxes=3, machines=48)


def last_tick(fleet: Loopy) -> dict[str, Any]:
    tick = last_tick_mod.load(fleet.tmp / "state" / "boxes.json")
    assert tick is not None
    return tick.to_dict()


def test_a_portless_vast_box_is_reported_then_replaced_and_kept_until_its_successor_is_dialled(
        fleet: Loopy) -> None:
    with fleet.control() as c:  # every Vast host the role admits has one direct port: too few
        hosts = [m for m in c.machines() if m["provider"] == "vast" and m["card"] == "RTX 4090"
                 and m["driver"] == DRIVER and m["free_gpus"]]
        for m in hosts:
            c.shape_machine("vast", m["machine_id"], direct_port_count=1)
        spare = hosts[0]  # kept back, taken by other tenants, until the test offers it
        c.shape_machine("vast", spare["machine_id"], direct_port_count=100,
                        other_tenants=spare["free_gpus"])
    rows = fleet.settle()
    old = next(r for r in rows if r.provider == "vast")
    assert old.p2p_public_port is None and old.note is not None
    assert old.note.startswith("owed a port: no offer mapped the p2p port 26611")

    def reported() -> dict[str, Any] | None:
        t = fleet.tick()
        boxes = {b["label"]: b for b in json.loads(fleet.fleet("mesh", "--json").stdout)["boxes"]}
        return t if boxes[old.label]["star_only"] and old.label in t["owed_ports"] else None
    t = wait_for("the portless box reported star-only and owed a port", reported,
                 timeout=120, poll_s=1)
    assert t["owed_ports"][old.label] == ("no mapped p2p port: vast lists no public mapping "
                                          "of port 26611")
    assert any(a.startswith(f"{old.label}: owed a port") and "tried again next tick" in a
               for a in t["actions"]), t["actions"]
    assert "owed a port" in fleet.fleet("check", check=False).stdout

    with fleet.control() as c:  # a host that maps a port is offered
        c.shape_machine("vast", spare["machine_id"], other_tenants=0)
    started = time.monotonic()
    seen: list[dict[str, Any]] = []

    def replaced() -> bool:
        fleet.tick()
        saved = last_tick(fleet)
        seen.append(saved)
        return not fleet.rows()[old.label].live
    wait_for(f"{old.label} replaced for a port", replaced, timeout=600, poll_s=1)
    took = time.monotonic() - started
    new = next(r for r in fleet.rows().values() if r.move_of == old.label)
    assert new.move_for == "port" and new.p2p_public_port is not None
    assert new.place == f"vast machine {spare['machine_id']}"
    # the tick that destroyed the old box had checked the new node well, synced and dialled
    checked = {h["label"]: h for h in seen[-1]["health"]}[new.label]
    assert checked["well"] and checked["synced"] and checked["peers_in"] >= 2, checked
    print(f"ports: {old.label} replaced by {new.label} {took:.1f} s after a host with a port "
          "was offered")
    gone = fleet.rows()[old.label]
    assert gone.note is not None and gone.note.startswith(f"replaced by {new.label}")

    live = fleet.live()
    assert old.label not in {r.label for r in live} and len(live) == 3
    for row in live:
        want = sorted(f"{r.public_ip}:{r.p2p_public_port}" for r in live if r.label != row.label)
        got = fleet.ssh(row, "cat /root/fleet/peers.txt").split()
        assert got == want, (row.label, got, want)
    t = fleet.tick()
    assert t["owed_ports"] == {}
