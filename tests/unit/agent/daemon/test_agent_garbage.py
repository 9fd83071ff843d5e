"""Garbage in, a clear line out: a state.json holding NaN or 1e300, a node RPC answering
`"blocks": Infinity`, a pointer that is a FIFO or far too large, a status file over the cap:
each is refused or dropped with a reason, and the agent goes on supervising, writing its status
and its RESULT line. So too a NUL byte in a recorded path or the pointer, JSON nested too deep to
parse, and huge or wrongly-typed RPC figures."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from agentbox import PY, Box, wait_for

from agent.base.config import parse_config
from agent.base.files import DigestCache, read_json
from agent.base.journal import Journal
from agent.base.persist import AgentState
from agent.base.pointer import Pointer, check_pointer
from agent.daemon import status
from agent.daemon.probes import ProbeError, parse_json
from agent.daemon.supervisor import Supervisor


def start(box: Box, **configure: object) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(**configure)  # type: ignore[arg-type]
    box.start_agent()


def result_lines(box: Box) -> list[str]:
    log = box.root / "out" / "standing.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_state_file_of_nan_and_huge_numbers_is_dropped_not_fatal(box: Box) -> None:
    (box.root / "run").mkdir(parents=True, exist_ok=True)
    (box.root / "run" / "state.json").write_text(
        '{"last_result_at": 1e300, "pack_seed": "s", "recovery": {"finished_at": NaN, '
        '"started_at": -1e300, "runs": Infinity}, "switch": {"applied_at": 1e300, '
        '"to_sha16": "00"}, "tasks": {"recovery": {"pid": 1e300, "started_at": NaN}}}')
    start(box, result_every_s=0.5)
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    wait_for(lambda: len(result_lines(box)) >= 2, "RESULT lines")
    assert "state: dropped what is not a sane value" in box.journal()
    assert "last_result_at" in box.journal() and "recovery.finished_at" in box.journal()
    box.wait_ticks(3)
    assert box.agents[-1].poll() is None


def test_an_rpc_answering_infinity_is_a_reading_error_and_ticks_go_on(box: Box) -> None:
    recipe = box.root / "in" / "box-exec-snapshot.sh"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text("#!/bin/sh\ntrue\n")
    recipe.chmod(0o755)
    start(box, result_every_s=0.5, sections={"recovery": {
        "recipe": "{root}/in/box-exec-snapshot.sh"}})
    wait_for(lambda: box.status()["node"]["rpc"], "a first good reading")
    box.set_node_state(synced=True, blocks=float("inf"), exec_tip=0)  # "blocks": Infinity
    error = wait_for(lambda: box.status()["node"]["rpc_error"], "the answer refused")
    assert "Infinity is not a finite number" in error
    seen = len(result_lines(box))
    box.wait_ticks(5)  # status.json keeps being written
    wait_for(lambda: len(result_lines(box)) >= seen + 2, "RESULT lines go on")
    assert "blocks=-" in result_lines(box)[-1]
    assert box.status()["recovery"]["runs"] == 0


def test_a_pointer_that_is_a_fifo_or_too_large_is_refused_with_a_reason(box: Box) -> None:
    start(box)
    node = wait_for(lambda: box.pid_of("node"), "the node running")
    pointer = box.root / "standing.node"
    pointer.unlink()
    os.mkfifo(pointer)  # reading it would block for ever
    view = wait_for(lambda: box.status()["node"]["pointer"]["state"] == "refused"
                    and box.status()["node"]["pointer"], "the FIFO refused", timeout=15)
    assert "standing.node is not a regular file" in view["reason"]
    pointer.unlink()
    pointer.write_text("/" + "x" * 10000 + "\n")
    view = wait_for(lambda: "larger than a pointer" in
                    (box.status()["node"]["pointer"]["reason"] or "")
                    and box.status()["node"]["pointer"], "the huge pointer refused")
    assert view["state"] == "refused"
    assert box.pid_of("node") == node  # the node keeps running


def test_a_status_file_over_the_cap_is_refused(box: Box) -> None:
    big = box.tmp / "prover.json"
    big.write_text(json.dumps({"state": "proving", "pad": "x" * (2 << 20)}))
    start(box, program_overrides={"prover": {
        "command": [PY, f"{box.bin}/prover.py", "prover"], "status_file": str(big)}})
    # a reading taken before the prover's start is not its own ("no reading since its
    # start"): the first one of this process tells the cap
    prover = wait_for(lambda: "over the 1 MiB cap" in (box.program("prover").get("health_error")
                                                       or "") and box.program("prover"),
                      "the prover's status read")
    assert prover["healthy"] is False


def test_a_failing_step_of_a_tick_leaves_the_others_running(tmp_path: Path) -> None:
    root = tmp_path / "fleet"
    cfg = parse_config({"root": str(root), "result_every_s": 1, "programs": {}},
                       tmp_path / "a.toml")
    cfg.layout.ensure()
    sup = Supervisor(cfg, Journal(cfg.layout.agent_log))

    def broken(*_: object) -> None:
        raise OverflowError("cannot convert float infinity to integer")

    sup.recovery.maybe_start = broken  # type: ignore[method-assign]
    sup.switch.follow = broken  # type: ignore[method-assign]
    sup._tick()
    sup._tick()
    assert json.loads(cfg.layout.status.read_text())["agent"]["ticks"] == 2
    assert "RESULT standing" in cfg.layout.standing_log.read_text()
    log = cfg.layout.agent_log.read_text()
    assert log.count("recovery: failed (continuing without it): OverflowError") == 1
    assert log.count("pointer: failed (continuing without it): OverflowError") == 1


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
