"""agent.toml as the standing deploy renders it from a role: GPU programs carry `needs_gpu`,
the node is restarted when its RPC stays silent, and the agent accepts what fleet writes."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest
from repo_root import ROOT

from agent.base.config import parse_config
from fleet.boxes.agent_config import render
from fleet.core.config import Role, load
from fleet.core.errors import ConfigError

SHA16 = "04c82f6f904c054d"
REL = f"/root/fleet/releases/{SHA16}"
RPC = "http://127.0.0.1:16110"

# what the renderer wrote before GPU programs and the unhealthy restart were configurable
# (fleet.toml's live role): every key here must keep its value
BEFORE: dict[str, Any] = {
    "root": "/root/fleet",
    "admitted_driver": "580.95.05",
    "qualified_gpus": [],
    "p2p_port": 26611,
    "recovery": {"recipe": ["/root/fleet/in/box-exec-snapshot.sh", "/root/fleet/node"],
                 "min_blocks": 1000, "cooldown_s": 1800},
    "miner_pack": {"command": [f"{REL}/igneum-miner", "export-pack", "--node-rpc", RPC,
                               "--pack", "/root/fleet/pack"]},
    "programs": {
        "node": {
            "command": ["{node_bin}", "--datadir", "/root/fleet/node", "--p2p-port",
                        "{p2p_port}", "--p2p-public", "{p2p_public_ip}:{p2p_public_port}",
                        "--peers-file", "/root/fleet/peers.txt", "--rpc-port", "16110"],
            "status_url": f"{RPC}/status",
        },
        "miner": {
            "command": [f"{REL}/igneum-miner", "--node-rpc", RPC, "--pack", "/root/fleet/pack",
                        "--status-file", "/root/fleet/run/miner.json"],
            "needs_gpu": True,
            "status_file": "/root/fleet/run/miner.json",
        },
        "prover": {
            "command": [f"{REL}/igneum-prover", "--node-rpc", RPC, "--status-file",
                        "/root/fleet/run/prover.json"],
            "status_file": "/root/fleet/run/prover.json",
        },
    },
}


def live_role() -> Role:
    return load(ROOT / "fleet.toml").role("live")


def rendered(role: Role) -> dict[str, Any]:
    return tomllib.loads(render(role, SHA16, "RTX 4090"))


def test_every_program_that_uses_the_gpu_is_marked() -> None:
    programs = rendered(live_role())["programs"]
    assert programs["miner"]["needs_gpu"] is True
    assert programs["prover"]["needs_gpu"] is True  # was missing: the prover ran unadmitted
    assert programs["node"]["needs_gpu"] is False  # explicit: the agent gates miner and
    #                                                 prover by default, never by omission


def test_the_node_is_restarted_after_300_s_without_an_answer_by_default() -> None:
    node = rendered(live_role())["programs"]["node"]
    assert node["restart_unhealthy_after_s"] == 300
    quiet = dataclasses.replace(live_role(), node_unhealthy_restart_s=0)
    assert rendered(quiet)["programs"]["node"]["restart_unhealthy_after_s"] == 0
    assert "restart_unhealthy_after_s" not in rendered(live_role())["programs"]["miner"]


def test_nothing_else_changed_meaning() -> None:
    now = rendered(live_role())
    for name, program in now["programs"].items():
        program.pop("restart_unhealthy_after_s", None)
        if name != "miner":
            program.pop("needs_gpu")
    assert now == BEFORE


def test_the_agent_accepts_what_fleet_renders(tmp_path: Path) -> None:
    cfg = parse_config(rendered(live_role()), tmp_path / "agent.toml")
    assert cfg.admitted_driver == "580.95.05"
    assert [n for n, p in cfg.programs.items() if p.needs_gpu] == ["miner", "prover"]
    assert cfg.programs["node"].restart_unhealthy_after_s == 300.0
    node_only = dataclasses.replace(live_role(), programs=("node",), admitted_driver=None)
    cfg = parse_config(rendered(node_only), tmp_path / "agent.toml")
    assert list(cfg.programs) == ["node"] and cfg.admitted_driver == ""


def test_a_gpu_role_without_a_driver_is_never_rendered() -> None:
    unguarded = dataclasses.replace(live_role(), admitted_driver=None)
    with pytest.raises(ConfigError, match="miner needs the GPU but admitted_driver is not set"):
        render(unguarded, SHA16, "RTX 4090")


def test_values_are_quoted_for_toml() -> None:
    odd = dataclasses.replace(live_role(), admitted_driver='580"\\x', qualified_gpus=("G\n1",))
    doc = rendered(odd)
    assert doc["admitted_driver"] == '580"\\x' and doc["qualified_gpus"] == ["G\n1"]
    assert render(live_role(), SHA16, "RTX 4090").startswith(
        "# written by fleet's standing deploy; edits are overwritten\n")
