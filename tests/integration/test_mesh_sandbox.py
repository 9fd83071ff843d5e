"""The p2p mesh on real sandbox boxes: four standing boxes on both providers, converted by the
loop, whose nodes dial each other through the boxes' public p2p mappings. Every node holds at
least two inbound peers within one loop interval of the roster settling, the counts the nodes
report match the TCP connections seen on the boxes, and a host death's replacement reaches
every peers file without any node restarting.

The steps build on one roster, so they run as one test.
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

from sandbox import fleet_toml

ROSTER = fleet_toml.ROSTER_4090  # two standing boxes a provider
P2P = 26611  # the live role's p2p port (sandbox/fleet_toml.py)


def config(state: Path) -> str:
    return fleet_toml.render(state, budget=500, loop=LOOP, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "mesh", config, boxes=4, machines=64)


def mesh(fleet: Loopy) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fleet.fleet("mesh", "--json").stdout)
    return data


def connections(fleet: Loopy, label: str) -> tuple[int, set[str]]:
    """(inbound, outbound remotes) of the box's established p2p connections, as `ss` sees
    them on the box: inbound on the node's p2p port, outbound to another box's mapping."""
    rows = fleet.rows()
    out = fleet.ssh(rows[label], "ss -Htn state established")
    inbound, remotes = 0, set()
    for line in out.splitlines():
        parts = line.split()
        local, peer = parts[-2], parts[-1]
        if local.endswith(f":{P2P}"):
            inbound += 1
        else:
            remotes.add(peer)
    mapped = {f"{r.public_ip}:{r.p2p_public_port}" for r in rows.values() if r.live}
    return inbound, remotes & mapped


def node_pids(fleet: Loopy) -> dict[str, Any]:
    pids = {}
    for row in fleet.live():
        out = fleet.ssh(row, "cd /root/fleet && venv/bin/python -m agent status")
        pids[row.label] = ((json.loads(out).get("programs") or {}).get("node") or {}).get("pid")
    return pids


def test_every_node_is_dialled_the_counts_are_real_and_a_replacement_joins_without_restarts(
        fleet: Loopy) -> None:
    rows = fleet.settle()
    assert sorted(r.provider for r in rows) == ["runpod", "runpod", "vast", "vast"]
    settled = time.monotonic()

    def meshed() -> dict[str, Any] | None:
        fleet.tick()
        m = mesh(fleet)
        return m if all((b["peers_in"] or 0) >= 2 for b in m["boxes"]) else None
    m = wait_for("every node with two inbound peers", meshed, timeout=300, poll_s=1)
    took = time.monotonic() - settled
    print(f"mesh: every node held 2 inbound peers {took:.1f} s after the roster settled")
    assert m["dialable"] == m["known"] == 4 and m["star_only"] == []
    for box in m["boxes"]:
        inbound, outbound = connections(fleet, box["label"])
        assert box["peers_in"] == inbound, (box, inbound)
        assert {p["remote"] for p in box["peers"] if p["dir"] == "out"} == outbound
        assert all(p["box"] for p in box["peers"] if p["dir"] == "out"), box

    # a host dies: its replacement reaches every peers file, and no node restarts for it
    before = node_pids(fleet)
    old = next(r for r in rows if r.provider == "vast")
    fleet.fleet("sandbox", "fault", "host_death", old.label)

    def joined() -> bool:
        fleet.tick()
        new = next((r for r in fleet.live() if r.rerent_of == old.label and r.standing), None)
        return new is not None
    wait_for(f"{old.label} replaced", joined, timeout=600, poll_s=1)
    fleet.settle()
    live = fleet.live()
    for row in live:
        want = sorted(f"{r.public_ip}:{r.p2p_public_port}" for r in live if r.label != row.label)
        got = fleet.ssh(row, "cat /root/fleet/peers.txt").split()
        assert got == want, (row.label, got, want)
    after = node_pids(fleet)
    assert {k: v for k, v in after.items() if k in before} == \
        {k: v for k, v in before.items() if k in after}, (before, after)
    m = wait_for("the replacement dialled by two peers", meshed, timeout=300, poll_s=1)
    assert old.label not in {b["label"] for b in m["boxes"]}
