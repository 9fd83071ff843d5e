"""Admission on an AMD box through AMD SMI (the real amdsmi binding against the stand-in
libamd_smi.so): the exact amdgpu driver and ROCm release, the qualified GPUs by their unique
id, and every failure a refusal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agentbox import AMD_DRIVER, AMD_UUIDS, ROCM, Box, amd_gpu_spec, wait_for


def start(box: Box, **top: object) -> None:
    path, sha = box.release("v1")
    box.point(path, sha)
    box.configure_amd(**top)
    box.start_agent()


def admit_now(box: Box) -> dict:
    return json.loads(box.agent_cli("admit", "--config", str(box.config_path)).stdout)


def test_the_exact_amdgpu_driver_and_rocm_admit_and_the_status_names_them(
        box: Box, rocm_dir: Path) -> None:
    box.make_amd(rocm_dir)
    start(box, qualified_gpus=AMD_UUIDS)
    for name in ("node", "miner", "prover"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    admission = box.status()["admission"]
    assert admission["admitted"] is True
    assert (admission["vendor"], admission["driver"], admission["rocm"]) == ("amd", AMD_DRIVER,
                                                                             ROCM)
    assert (admission["wanted_driver"], admission["wanted_rocm"]) == (AMD_DRIVER, ROCM)
    assert admission["uuids"] == AMD_UUIDS
    assert admission["reason"] == (f"amdgpu driver {AMD_DRIVER}, ROCm {ROCM}, "
                                   "2 GPU(s) qualified")
    facts = json.loads(box.agent_cli("gpu", "--vendor", "amd").stdout)
    assert (facts["vendor"], facts["driver"], facts["rocm"], facts["error"]) == (
        "amd", AMD_DRIVER, ROCM, None)
    assert [d["name"] for d in facts["devices"]] == ["AMD Instinct MI300X"] * 2
    line = box.agent_cli("status", "--config", str(box.config_path)).stdout
    assert '"vendor": "amd"' in line and f'"rocm": "{ROCM}"' in line


def test_a_drifted_amdgpu_driver_is_refused_and_the_miner_never_starts(
        box: Box, rocm_dir: Path) -> None:
    box.make_amd(rocm_dir, amd_gpu_spec(driver="6.12.10"))
    start(box)
    wait_for(lambda: box.pid_of("node"), "node running")
    expected = f"amdgpu driver 6.12.10 is not the admitted {AMD_DRIVER}"
    for name in ("miner", "prover"):
        program = wait_for(lambda n=name: box.program(n).get("state") == "blocked"
                           and box.program(n), f"{name} blocked")
        assert expected in program["reason"]
    box.wait_ticks(5)
    assert box.invocations("miner") == [] and box.invocations("prover") == []
    assert f"admission: REFUSED: {expected}" in box.journal()


def test_drift_under_a_live_amd_box_stops_the_miner_until_the_driver_is_back(
        box: Box, rocm_dir: Path) -> None:
    box.make_amd(rocm_dir)
    start(box)
    wait_for(lambda: box.pid_of("miner"), "miner running")
    box.set_gpu(amd_gpu_spec(driver="6.12.10"))
    wait_for(lambda: not box.running("miner"), "miner stopped")
    assert "amdgpu driver 6.12.10" in box.status()["admission"]["reason"]
    box.set_gpu(amd_gpu_spec())
    wait_for(lambda: box.pid_of("miner"), "miner running again")
    wait_for(lambda: len(box.invocations("miner")) == 2, "the miner's second start recorded")


@pytest.mark.parametrize("case", ["ROCm mismatch", "stranger GPU", "no ROCm library",
                                  "amdgpu not loaded", "no GPU"])
def test_each_amd_failure_is_a_refusal_with_its_reason(box: Box, rocm_dir: Path,
                                                        case: str) -> None:
    box.make_amd(rocm_dir)
    top: dict[str, object] = {}
    if case == "ROCm mismatch":
        box.set_gpu(amd_gpu_spec(rocm="6.4.0"))
        expected = f"ROCm 6.4.0 is not the admitted {ROCM}"
    elif case == "stranger GPU":
        top["qualified_gpus"] = [AMD_UUIDS[0]]
        expected = f"GPU {AMD_UUIDS[1]} is not among the qualified GPUs"
    elif case == "no ROCm library":
        empty = box.tmp / "no-rocm-here"
        (empty / "lib").mkdir(parents=True)
        box.env_extra["ROCM_PATH"] = str(empty)
        expected = "libamd_smi.so not loadable"
    elif case == "amdgpu not loaded":
        box.amdsmi_config.unlink()
        expected = "AMD SMI init failed (amdgpu not loaded?)"
    else:
        box.set_gpu(amd_gpu_spec(uuids=[]))
        expected = "AMD SMI sees no GPU"
    box.configure_amd(**top)
    verdict = admit_now(box)
    assert verdict["admitted"] is False and expected in verdict["reason"], verdict
    assert verdict["vendor"] == "amd" and "\n" not in verdict["reason"]


def test_without_rocm_the_gpu_command_prints_clean_json(box: Box) -> None:
    box.env_extra["ROCM_PATH"] = str(box.tmp)  # no lib/libamd_smi.so under it
    facts = json.loads(box.agent_cli("gpu", "--vendor", "amd").stdout)  # nothing else printed
    assert facts["vendor"] == "amd" and "libamd_smi.so not loadable" in facts["error"]


def test_a_hung_amd_smi_refuses_gpu_work_while_the_loop_runs_on(box: Box, rocm_dir: Path) -> None:
    box.make_amd(rocm_dir)
    hang = box.tmp / "amdsmi-hang"
    box.env_extra["SANDBOX_AMDSMI_HANG"] = str(hang)
    start(box)
    for name in ("node", "miner"):
        wait_for(lambda n=name: box.pid_of(n), f"{name} running")
    node = box.pid_of("node")
    hang.write_text("")  # the next check (each reconcile, 1 s) hangs in amdsmi_init
    box.wait_ticks(10)
    box.set_node_state(blocks=4321)
    wait_for(lambda: (box.status()["node"]["rpc"] or {}).get("blocks") == 4321,
             "readings still taken while AMD SMI hangs")
    assert "the AMD SMI check started" in box.journal()
    wait_for(lambda: not box.running("miner"), "miner stopped", timeout=40)
    assert "(AMD SMI hung?)" in box.status()["admission"]["reason"]
    assert box.pid_of("node") == node
    hang.unlink()
    wait_for(lambda: box.pid_of("miner"), "miner running again")


@pytest.mark.parametrize(("top", "expected"), [
    ({"gpu_vendor": "intel"}, "gpu_vendor must be one of nvidia, amd, got 'intel'"),
    ({"admitted_rocm": ""}, "admitted_rocm is not set"),
    ({"gpu_vendor": "nvidia", "admitted_driver": "580.95.05"},
     "admitted_rocm is for gpu_vendor = \"amd\" only"),
])
def test_a_bad_amd_config_is_one_line_and_exit_2(box: Box, top: dict, expected: str) -> None:
    box.configure_amd(**top)
    done = box.agent_cli("admit", "--config", str(box.config_path), check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and expected in done.stderr, done.stderr
