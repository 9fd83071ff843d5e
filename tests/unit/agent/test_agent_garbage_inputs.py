"""Garbage the agent survives: a NUL byte in a recorded path, JSON nested too deep to
parse, huge or wrongly-typed RPC figures; and the GPU gate's default."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from agentbox import Box

from agent.base.config import load_config
from agent.base.files import DigestCache, read_json
from agent.base.persist import AgentState
from agent.base.pointer import Pointer, check_pointer
from agent.daemon import status
from agent.daemon.probes import ProbeError, parse_json


def test_a_nul_byte_in_the_recorded_node_path_is_dropped() -> None:
    raw = {"node_binary": {"path": "/releases/x\x00y/node", "sha256": "0" * 64,
                           "source": "adopted"}}
    state, dropped = AgentState.from_raw(raw)
    assert state.node_binary is None and dropped == ["node_binary"]
    relative = {"node_binary": {"path": "releases/node", "sha256": "0" * 64, "source": "x"}}
    assert AgentState.from_raw(relative)[0].node_binary is None


def test_a_nul_byte_in_the_pointer_is_refused() -> None:
    verdict = check_pointer(Pointer("/a\x00b", "0" * 64), DigestCache().digest)
    assert not verdict.ok and "NUL" in (verdict.reason or "")


def test_a_nul_byte_in_the_state_never_stops_the_ticks(box: Box) -> None:
    box.configure(programs=("node",))
    (box.root / "run").mkdir(parents=True, exist_ok=True)
    (box.root / "run" / "state.json").write_text(json.dumps({"node_binary": {
        "path": str(box.root / "releases" / "x\x00y" / "node"), "sha256": "0" * 64,
        "source": "adopted"}}))
    box.start_agent()
    t0 = box.ticks()
    time.sleep(3)
    assert box.ticks() - t0 >= 5


def test_json_nested_too_deep_reads_as_garbage(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000)
    assert read_json(deep) is None
    with pytest.raises(ProbeError):
        parse_json(b"[" * 200000, "status")


def test_a_deeply_nested_state_never_keeps_the_agent_from_starting(box: Box) -> None:
    box.configure(programs=("node",))
    (box.root / "run").mkdir(parents=True, exist_ok=True)
    (box.root / "run" / "state.json").write_text("[" * 200000)
    box.start_agent()  # asserts the agent is up and writing its status


def _status_with(rpc: dict[str, object], miner: dict[str, object]) -> dict[str, object]:
    return {"ts": "t", "agent": {"uptime_s": 1}, "programs": {"node": {}},
            "node": {"sha16": "x", "rpc": status._pick(rpc, status.NODE_FIELDS)},
            "miner": miner, "prover": {"state": "p" * 10_000},
            "admission": {"admitted": True}, "p2p": {"mapped": False}}


def test_huge_or_mistyped_rpc_values_never_reach_the_result_line() -> None:
    rpc = {"version": "v" * 1_000_000, "blocks": "9" * 1_000_000, "peers": 2**70,
           "synced": "yes", "daa_score": True, "exec_tip": 12, "seed": ["a"] * 1000}
    picked = status._pick(rpc, status.NODE_FIELDS)
    assert picked is not None
    assert picked["blocks"] is None and picked["peers"] is None and picked["synced"] is None
    assert picked["daa_score"] is None and picked["seed"] is None and picked["exec_tip"] == 12
    assert len(picked["version"]) <= status.MAX_TEXT
    line = status.result_line(_status_with(rpc, {"hashrate": "x" * 100_000}))
    assert len(line) < 4096


def test_the_standing_log_is_rotated(box: Box) -> None:
    from agent.daemon.supervisor import Supervisor

    box.configure(programs=("node",))
    sup = Supervisor(load_config(box.config_path), lambda _: None)  # type: ignore[arg-type]
    assert sup.layout.standing_log in sup._log_paths()


def test_every_program_but_the_node_needs_a_gpu_unless_told(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text(f'root = "{tmp_path}"\nadmitted_driver = "580.95.05"\n'
                   '[programs.node]\ncommand = ["/bin/true"]\n'
                   '[programs.watcher]\ncommand = ["/bin/true"]\n'
                   '[programs.helper]\ncommand = ["/bin/true"]\nneeds_gpu = false\n')
    programs = load_config(cfg).programs
    assert {n: p.needs_gpu for n, p in programs.items()} == {
        "node": False, "watcher": True, "helper": False}
