"""Admission through NVML, against the stand-in libnvidia-ml.so.1 the sandbox uses."""

from __future__ import annotations

import json

import pytest
from agentbox import DRIVER, UUIDS, Box, gpu_spec, wait_for


def start(box: Box, **top: object) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure(**top)  # type: ignore[arg-type]
    box.start_agent()


@pytest.mark.parametrize("case", ["wrong driver", "unqualified GPU", "no NVML library",
                                  "driver not loaded"])
def test_refused_admission_starts_no_gpu_program_and_keeps_the_node(box: Box, case: str) -> None:
    top: dict[str, object] = {}
    if case == "wrong driver":
        box.set_gpu(gpu_spec(driver="570.133.20"))
        expected = f"driver 570.133.20 is not the admitted {DRIVER}"
    elif case == "unqualified GPU":
        top["qualified_gpus"] = [UUIDS[0]]  # the box's second GPU is not qualified
        expected = f"GPU {UUIDS[1]} is not among the qualified GPUs"
    elif case == "no NVML library":
        box.nvml_dir = box.tmp / "no-driver-here"
        box.nvml_dir.mkdir()
        expected = "libnvidia-ml.so.1 not found"
    else:
        box.nvml_config.unlink()  # the stand-in then fails nvmlInit like an unloaded driver
        expected = "Driver Not Loaded"
    start(box, **top)
    wait_for(lambda: box.pid_of("node"), "node running")
    for name in ("miner", "prover"):
        program = wait_for(lambda n=name: box.program(n).get("state") == "blocked"
                           and box.program(n), f"{name} blocked")
        assert expected in program["reason"]
    admission = box.status()["admission"]
    assert admission["admitted"] is False and expected in admission["reason"]
    box.wait_ticks(5)
    assert box.invocations("miner") == [] and box.invocations("prover") == []
    assert box.running("miner") == [] and box.running("prover") == []
    assert f"admission: REFUSED: {admission['reason']}" in box.journal()
    verdict = json.loads(box.agent_cli("admit", "--config", str(box.config_path)).stdout)
    assert verdict["admitted"] is False and expected in verdict["reason"]
    assert verdict["wanted_driver"] == DRIVER


def test_a_driver_change_under_a_live_box_stops_gpu_work_until_it_is_back(box: Box) -> None:
    start(box, qualified_gpus=UUIDS)
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    node = box.pid_of("node")
    box.set_gpu(gpu_spec(driver="580.65.06"))  # the host's driver changed under the box
    for name in ("miner", "prover"):
        wait_for(lambda n=name: box.program(n).get("state") == "blocked", f"{name} stopped")
        wait_for(lambda n=name: not box.running(n), f"{name} process gone")
    assert "driver 580.65.06 is not the admitted" in box.status()["admission"]["reason"]
    assert box.pid_of("node") == node  # the node needs no GPU and is not touched
    box.set_gpu(gpu_spec())
    for name in ("miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running again")
    assert box.status()["admission"]["admitted"] is True
    wait_for(lambda: len(box.invocations("miner")) == 2, "the miner's second start recorded")
