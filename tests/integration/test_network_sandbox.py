"""A network of boxes with different duties on real sandbox boxes: a devnet of one seed node,
three miners and two provers (three roles, one `[networks.dn2]`), rented and converted by the
loop's standing deploy. Every node is dialled by at least two peers of the network, every
peers file names the network's other boxes whatever their role, the peers deploy finds them
current (twice, no change), and a miner's host death is replaced into the mesh.

The steps build on one roster, so they run as one test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import BIN, wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.core.boxes import Row
from sandbox import fleet_toml

DUTIES = {"dn2-seed": '["node"]', "dn2-miner": '["node", "miner"]',
          "dn2-prover": '["node", "prover"]'}
ROSTER = {"dn2-seed": [("vast", 1)], "dn2-miner": [("vast", 2), ("runpod", 1)],
          "dn2-prover": [("runpod", 2)]}
BOXES = 6


def devnet() -> str:
    out = ['[networks.dn2]\nroles = ["dn2-seed", "dn2-miner", "dn2-prover"]\n']
    for role, programs in DUTIES.items():
        out.append(fleet_toml.LIVE_ROLE.replace("[roles.live]", f"[roles.{role}]").replace(
            'programs = ["node", "miner", "prover"]', f"programs = {programs}"))
        out += [f'[[roster.{role}]]\nprovider = "{p}"\ncard = "RTX 4090"\ncount = {n}\n'
                for p, n in ROSTER[role]]
    return "".join(out)


def config(state: Path) -> str:
    return fleet_toml.render(state, budget=500, loop=LOOP, roles=devnet())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "network", config, boxes=BOXES, machines=64)


def mesh(fleet: Loopy) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(fleet.fleet("mesh", "--json").stdout)
    return data


def meshed(fleet: Loopy) -> dict[str, Any] | None:
    """`fleet mesh` once every node is dialled by two peers, after a tick; else None."""
    fleet.tick()
    m = mesh(fleet)
    return m if len(m["boxes"]) == BOXES and all(
        (b["peers_in"] or 0) >= 2 for b in m["boxes"]) else None


def endpoint(r: Row) -> str:
    return f"{r.public_ip}:{r.p2p_public_port}"


def peers_files_name_the_network(fleet: Loopy) -> None:
    live = fleet.live()
    assert len({r.role for r in live}) == 3
    for row in live:
        want = sorted(endpoint(r) for r in live if r.label != row.label)
        assert fleet.ssh(row, "cat /root/fleet/peers.txt").split() == want, row.label


def test_a_devnet_of_three_duties_is_one_mesh_and_a_miner_s_replacement_joins_it(
        fleet: Loopy) -> None:
    rows = fleet.settle()
    assert sorted(r.role for r in rows) == ["dn2-miner"] * 3 + ["dn2-prover"] * 2 + ["dn2-seed"]
    m = wait_for("every node dialled by two peers", lambda: meshed(fleet), timeout=300,
                 poll_s=1)
    net = m["networks"]["dn2"]
    assert list(m["networks"]) == ["dn2"] and net["known"] == net["dialable"] == BOXES
    assert net["star_only"] == [] and net["owed_port"] == {}
    labels = {r.label for r in rows}
    for box in m["boxes"]:  # each node dials boxes of the network, whatever their role
        assert box["network"] == "dn2"
        out = [p["box"] for p in box["peers"] if p["dir"] == "out"]
        assert out and set(out) <= labels - {box["label"]}, box
    # the duties: a seed runs the node alone, a miner no prover, a prover no miner
    for row in rows:
        programs = json.loads(fleet.ssh(row, "cd /root/fleet && venv/bin/python -m agent "
                                             "status"))["programs"]
        assert sorted(programs) == sorted(json.loads(DUTIES[row.role])), row.label
    peers_files_name_the_network(fleet)
    for _ in range(2):  # what the loop runs when the set changes: nothing to change here
        r = fleet.run(str(BIN / "pyinfra"), "-y", "inventory.py", "deploys/peers.py")
        out = r.stdout + r.stderr
        total = next(line for line in out.splitlines() if "Grand total" in line).split()
        assert total[3:5] == ["-", "-"], out[-2000:]

    # a miner's host dies: the loop replaces it in its role, and the replacement joins the
    # network's mesh (its peers file and every mate's name it, and two peers dial it)
    old = next(r for r in rows if r.role == "dn2-miner" and r.provider == "vast")
    fleet.fleet("sandbox", "fault", "host_death", old.label)

    def replaced() -> Row | None:
        fleet.tick()
        return next((r for r in fleet.live() if r.rerent_of == old.label and r.standing), None)
    new = wait_for(f"{old.label} replaced", replaced, timeout=600, poll_s=1)
    assert new.role == "dn2-miner"
    fleet.settle()
    peers_files_name_the_network(fleet)
    m = wait_for("the replacement dialled by two peers", lambda: meshed(fleet), timeout=300,
                 poll_s=1)
    assert old.label not in {b["label"] for b in m["boxes"]}
    assert next(b for b in m["boxes"] if b["label"] == new.label)["peers_in"] >= 2
