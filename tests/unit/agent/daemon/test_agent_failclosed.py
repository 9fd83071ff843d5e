"""GPU work fails closed by default: the miner and the prover are gated by admission unless a
config says otherwise, explicitly, and a pack export (the miner's binary) running when
admission refuses is stopped."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest
from agentbox import PY, Box, gpu_spec, wait_for

from agent.base.config import parse_config
from agent.base.errors import AgentError


def test_miner_and_prover_need_the_gpu_unless_a_config_says_otherwise(tmp_path: Path) -> None:
    raw = {"programs": {"node": {"command": "/opt/node"}, "miner": {"command": "/opt/miner"},
                        "prover": {"command": "/opt/prover"}}}
    with pytest.raises(AgentError, match="programs.miner needs the GPU"):
        parse_config(raw, tmp_path / "a.toml")  # no driver named: refused, not ungated
    cfg = parse_config(dict(raw, admitted_driver="580.95.05"), tmp_path / "a.toml")
    assert [n for n, p in cfg.programs.items() if p.needs_gpu] == ["miner", "prover"]
    raw["programs"]["miner"]["needs_gpu"] = False  # type: ignore[index]
    raw["programs"]["prover"]["needs_gpu"] = False  # type: ignore[index]
    cfg = parse_config(raw, tmp_path / "a.toml")
    assert not any(p.needs_gpu for p in cfg.programs.values())


def exports_running(box: Box) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if any("export-pack" in a for a in p.info["cmdline"] or [])
            and any(str(box.tmp) in a for a in p.info["cmdline"] or [])]


def test_a_pack_export_running_when_admission_refuses_is_stopped(box: Box) -> None:
    export = box.bin / "export-pack.sh"
    export.write_text(f"#!/bin/sh\necho \"$1\" > \"$2/pack.txt\"\n"
                      f"exec {PY} -c 'import time; time.sleep(300)' {box.tmp}/export-pack\n")
    export.chmod(0o755)
    box.set_node_state(seed="seed-A")
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(sections={"miner_pack": {"command": [str(export), "{seed}", "{root}"],
                                           "retry_s": 1}})
    box.start_agent()
    wait_for(lambda: box.status()["miner"]["pack"]["exporting"] == "seed-A", "an export running")
    wait_for(lambda: exports_running(box), "the export's process")
    box.set_gpu(gpu_spec(driver="595.71.05"))  # admission now refuses the miner
    wait_for(lambda: not exports_running(box), "the export stopped", timeout=20)
    wait_for(lambda: box.status()["miner"]["pack"]["exporting"] is None, "no export reported")
    assert "(the miner may not run: admission refuses it)" in box.journal()
    box.set_gpu(gpu_spec())
    wait_for(lambda: box.status()["miner"]["pack"]["exporting"] == "seed-A",
             "the export again once admitted")
