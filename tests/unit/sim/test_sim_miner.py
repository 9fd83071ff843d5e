"""igneum-miner, run for real: NVML admission, invocations, pack export, stale packs, SIGTERM."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from sim_helpers import Procs, fast_knobs, free_port, read_json, wait_for, write_json

from sandbox.backend import GpuDevice, GpuSpec
from sandbox.nvml import write_config

UUIDS = ["GPU-11111111-2222-3333-4444-555555555555", "GPU-66666666-7777-8888-9999-000000000000"]


def gpu_env(nvml_dir: Path | None, uuids: list[str] | None, tmp: Path,
            **extra: str) -> dict[str, str]:
    """A box's environment: that NVML (None: no library at all) reporting those GPUs (None: no
    config, so nvmlInit fails as it does without a driver)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_LIBRARY_PATH", "SANDBOX_NVML_CONFIG", "CUDA_VISIBLE_DEVICES")}
    if nvml_dir is not None:
        env["LD_LIBRARY_PATH"] = str(nvml_dir)
    config = tmp / "nvml.json"
    if uuids is not None:
        devices = [GpuDevice(u, "NVIDIA H100 80GB HBM3", f"00000000:{i + 0x1B:02X}:00.0", 80 << 30)
                   for i, u in enumerate(uuids)]
        write_config(config, GpuSpec("580.95.05", 12080, devices))
    env["SANDBOX_NVML_CONFIG"] = str(config)
    env.update(extra)
    return env


def invocations(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def export(procs: Procs, rpc: str, pack: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(procs.release.file("igneum-miner")), "export-pack", "--node-rpc", rpc,
           "--pack", str(pack)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=20)


@pytest.mark.parametrize(("case", "why"), [
    ("no library", "NVML library not loadable"),
    ("init fails", "nvmlInit_v2 failed"),
    ("no devices", "NVML shows 0 device(s)"),
    ("none visible", "NVML shows 2 device(s), none admitted"),
])
def test_refuses_without_an_admitted_gpu(procs: Procs, tmp_path: Path, nvml_dir: Path,
                                         case: str, why: str) -> None:
    if case == "no library":
        env = gpu_env(None, UUIDS, tmp_path)
    elif case == "init fails":
        env = gpu_env(nvml_dir, None, tmp_path)
    elif case == "no devices":
        env = gpu_env(nvml_dir, [], tmp_path)
    else:
        env = gpu_env(nvml_dir, UUIDS, tmp_path, CUDA_VISIBLE_DEVICES="")
    status = tmp_path / "run" / "miner.json"
    proc, log = procs.start("igneum-miner", "--node-rpc", f"http://127.0.0.1:{free_port()}",
                            "--pack", str(tmp_path / "pack"), "--status-file", str(status),
                            env=env)
    assert proc.wait(timeout=20) == 3
    assert f"refusing to run: no admitted GPU: {why}" in log.read_text()
    runs = invocations(tmp_path / "miner-invocations.log")  # the default: beside the pack dir
    assert len(runs) == 1 and runs[0]["pid"] == proc.pid
    assert not status.exists()


def test_mines_on_a_fresh_pack_and_goes_stale_when_the_seed_moves(
        procs: Procs, tmp_path: Path, nvml_dir: Path) -> None:
    node = procs.node(fast_knobs())
    first = node.wait("synced", lambda s: s["synced"])
    pack, status, inv = tmp_path / "pack", tmp_path / "miner.json", tmp_path / "inv.log"
    made = export(procs, node.rpc, pack)
    assert made.returncode == 0 and first["seed"] in made.stdout
    assert read_json(pack / "pack.json") is not None
    args = ("--node-rpc", node.rpc, "--pack", str(pack), "--status-file", str(status),
            "--invocations", str(inv))
    miner, miner_log = procs.start("igneum-miner", *args, env=gpu_env(nvml_dir, UUIDS, tmp_path))
    mining = wait_for("a hash rate", lambda: (s := read_json(status)) and s["hashrate"] > 0 and s)
    assert set(mining) == {"hashrate", "seed", "pack_seed", "gpus", "ts"}
    assert mining["seed"] == mining["pack_seed"] == first["seed"] and mining["gpus"] == 2

    # a new epoch: blocks are ~1,200 (epoch 0 of 100,000), so epoch 1 of 1,000 holds for minutes
    write_json(node.knobs, fast_knobs(seed_every=1000))
    seed = hashlib.sha256(b"1").hexdigest()[:16]
    stale = wait_for("a stale pack", lambda: (s := read_json(status)) and s["seed"] == seed and s)
    assert stale["hashrate"] == 0.0 and stale["pack_seed"] == first["seed"]
    assert "stale_pack" in miner_log.read_text()

    assert export(procs, node.rpc, pack).returncode == 0
    miner.send_signal(signal.SIGTERM)
    assert miner.wait(timeout=20) == 0
    procs.start("igneum-miner", *args, env=gpu_env(nvml_dir, UUIDS, tmp_path))
    fresh = wait_for("mining the new pack", lambda: (s := read_json(status)) and
                     s["hashrate"] > 0 and s["pack_seed"] == seed and s)
    assert fresh["seed"] == seed
    assert len(invocations(inv)) == 2


def test_cuda_visible_devices_narrows_the_gpus(procs: Procs, tmp_path: Path,
                                               nvml_dir: Path) -> None:
    status = tmp_path / "miner.json"
    env = gpu_env(nvml_dir, UUIDS, tmp_path, CUDA_VISIBLE_DEVICES=UUIDS[1][:12])
    procs.start("igneum-miner", "--node-rpc", f"http://127.0.0.1:{free_port()}", "--pack",
                str(tmp_path / "pack"), "--status-file", str(status), env=env)
    waiting = wait_for("a status", lambda: read_json(status))
    assert waiting["gpus"] == 1
    assert waiting["seed"] == "" and waiting["hashrate"] == 0.0  # no node: nothing to mine


def test_export_pack_fails_cleanly_without_a_node(procs: Procs, tmp_path: Path) -> None:
    run = export(procs, f"http://127.0.0.1:{free_port()}", tmp_path / "pack")
    assert run.returncode == 1 and "export-pack failed" in run.stderr
    assert not (tmp_path / "pack" / "pack.json").exists()
    assert not (tmp_path / "miner-invocations.log").exists()


AMD_UUIDS = ["7eff74a1-0000-1000-8011-111111111111", "7fff74a1-0000-1000-8022-222222222222"]


def amd_env(rocm_dir: Path, uuids: list[str] | None, tmp: Path, **extra: str) -> dict[str, str]:
    """An AMD box's environment: no NVML, ROCm at `rocm_dir` reporting those GPUs (None: no
    world, so amdsmi_init fails as it does with amdgpu not loaded)."""
    from sandbox.amdsmi import CONFIG_ENV
    from sandbox.amdsmi import write_config as write_amd

    env = {k: v for k, v in gpu_env(None, None, tmp).items() if k != "HIP_VISIBLE_DEVICES"}
    env["ROCM_PATH"] = str(rocm_dir)
    config = tmp / "amdsmi.json"
    if uuids is not None:
        devices = [GpuDevice(u, "AMD Instinct MI300X", f"0000:{i + 0x0C:02x}:00.0", 192 << 30)
                   for i, u in enumerate(uuids)]
        write_amd(config, GpuSpec("6.12.12", 0, devices, vendor="amd", rocm_version="6.4.1"))
    env[CONFIG_ENV] = str(config)
    env.update(extra)
    return env


@pytest.mark.parametrize(("case", "gpus"), [("all", 2), ("one visible", 1)])
def test_on_an_amd_box_the_gpus_come_from_amd_smi_and_hip_visible_devices(
        procs: Procs, tmp_path: Path, rocm_dir: Path, case: str, gpus: int) -> None:
    extra = {"HIP_VISIBLE_DEVICES": "1"} if case == "one visible" else {}
    status = tmp_path / "miner.json"
    procs.start("igneum-miner", "--node-rpc", f"http://127.0.0.1:{free_port()}", "--pack",
                str(tmp_path / "pack"), "--status-file", str(status),
                env=amd_env(rocm_dir, AMD_UUIDS, tmp_path, **extra))
    assert wait_for("a status", lambda: read_json(status))["gpus"] == gpus


@pytest.mark.parametrize(("case", "why"), [
    ("amdgpu not loaded", "amdsmi_init failed"),
    ("none visible", "AMD SMI shows 2 device(s), none admitted"),
])
def test_on_an_amd_box_it_refuses_without_an_admitted_gpu(
        procs: Procs, tmp_path: Path, rocm_dir: Path, case: str, why: str) -> None:
    env = (amd_env(rocm_dir, None, tmp_path) if case == "amdgpu not loaded"
           else amd_env(rocm_dir, AMD_UUIDS, tmp_path, HIP_VISIBLE_DEVICES=""))
    proc, log = procs.start("igneum-miner", "--node-rpc", f"http://127.0.0.1:{free_port()}",
                            "--pack", str(tmp_path / "pack"), "--status-file",
                            str(tmp_path / "miner.json"), env=env)
    assert proc.wait(timeout=20) == 3
    assert f"refusing to run: no admitted GPU: {why}" in log.read_text()
