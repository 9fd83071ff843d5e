"""The stand-in libnvidia-ml.so.1, loaded by unchanged nvidia-ml-py in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from agentbox import UUIDS, gpu_spec

from sandbox.backend import GpuDevice, GpuSpec
from sandbox.nvml import build_library, write_config

PROBE = textwrap.dedent("""
    import json, sys
    import pynvml as n
    out = {}
    try:
        n.nvmlInit()
    except n.NVMLError as e:
        print(json.dumps({"init_error": type(e).__name__, "text": str(e)}))
        sys.exit(0)
    out["driver"] = n.nvmlSystemGetDriverVersion()
    out["cuda"] = [n.nvmlSystemGetCudaDriverVersion(), n.nvmlSystemGetCudaDriverVersion_v2()]
    out["count"] = n.nvmlDeviceGetCount()
    devices = []
    for i in range(out["count"]):
        h = n.nvmlDeviceGetHandleByIndex(i)
        d = {"uuid": n.nvmlDeviceGetUUID(h), "name": n.nvmlDeviceGetName(h)}
        try:
            d["serial"] = n.nvmlDeviceGetSerial(h)
        except n.NVMLError_NotSupported:
            d["serial"] = "not supported"
        pci = n.nvmlDeviceGetPciInfo(h)
        d["pci"] = [pci.busId, pci.domain, pci.bus, pci.device]
        m1 = n.nvmlDeviceGetMemoryInfo(h)
        m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
        d["memory"] = [m1.total, m1.used + m1.free, m2.total, m2.used + m2.free]
        d["temperature"] = n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)
        u = n.nvmlDeviceGetUtilizationRates(h)
        d["utilization"] = [u.gpu, u.memory]
        try:
            n.nvmlDeviceGetPowerUsage(h)
            d["power"] = "answered"
        except n.NVMLError_NotSupported:
            d["power"] = "not supported"
        devices.append(d)
    out["devices"] = devices
    h = n.nvmlDeviceGetHandleByUUID(devices[-1]["uuid"])
    out["by_uuid"] = n.nvmlDeviceGetName(h)
    try:
        n.nvmlDeviceGetHandleByUUID("GPU-nope")
    except n.NVMLError_NotFound:
        out["unknown_uuid"] = "not found"
    n.nvmlShutdown()
    try:
        n.nvmlSystemGetDriverVersion()
    except n.NVMLError_Uninitialized:
        out["after_shutdown"] = "uninitialized"
    print(json.dumps(out))
""")


def probe(nvml_dir: Path, config: Path) -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=str(nvml_dir), SANDBOX_NVML_CONFIG=str(config))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def test_pynvml_reads_the_configured_world(nvml_dir: Path, tmp_path: Path) -> None:
    spec = GpuSpec("580.95.05", 12080, [
        GpuDevice(UUIDS[0], "NVIDIA H100 80GB HBM3", "00000000:1B:00.0", 85899345920, "16501"),
        GpuDevice(UUIDS[1], 'NVIDIA "RTX" 4090 \u00e9', "00000000:2C:00.0", 25757220864, None),
    ])
    write_config(tmp_path / "world.json", spec)
    out = probe(nvml_dir, tmp_path / "world.json")
    assert out["driver"] == "580.95.05"
    assert out["cuda"] == [12080, 12080]
    assert out["count"] == 2
    first, second = out["devices"]
    assert first["uuid"] == UUIDS[0] and first["serial"] == "16501"
    assert first["pci"] == ["00000000:1B:00.0", 0, 0x1B, 0]
    assert first["memory"] == [85899345920] * 4
    assert first["temperature"] > 0 and first["utilization"] == [0, 0]
    assert first["power"] == "not supported"  # anything not modelled answers NotSupported
    assert second["name"] == 'NVIDIA "RTX" 4090 \u00e9'  # JSON escapes decoded
    assert second["serial"] == "not supported"  # a card without an inforom
    assert out["by_uuid"] == second["name"]
    assert out["unknown_uuid"] == "not found"
    assert out["after_shutdown"] == "uninitialized"


def test_the_world_is_reread_at_every_init(nvml_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "world.json"
    write_config(config, gpu_spec(driver="580.95.05"))
    script = textwrap.dedent(f"""
        import json, pathlib, pynvml as n
        from sandbox.backend import GpuSpec
        from sandbox.nvml import write_config
        seen = []
        n.nvmlInit(); seen.append(n.nvmlSystemGetDriverVersion()); n.nvmlShutdown()
        write_config(pathlib.Path({str(config)!r}), GpuSpec("570.133.20", 12060, []))
        n.nvmlInit(); seen.append(n.nvmlSystemGetDriverVersion())
        seen.append(n.nvmlDeviceGetCount()); n.nvmlShutdown()
        print(json.dumps(seen))
    """)
    env = dict(os.environ, LD_LIBRARY_PATH=str(nvml_dir), SANDBOX_NVML_CONFIG=str(config))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == ["580.95.05", "570.133.20", 0]


def test_missing_or_malformed_config_fails_init_as_driver_not_loaded(
        nvml_dir: Path, tmp_path: Path) -> None:
    assert probe(nvml_dir, tmp_path / "absent.json")["init_error"] == "NVMLError_DriverNotLoaded"
    bad = tmp_path / "bad.json"
    bad.write_text('{"driver_version": "580.95.05", "devices": [')
    assert probe(nvml_dir, bad)["init_error"] == "NVMLError_DriverNotLoaded"


def test_build_library_reuses_a_fresh_build(tmp_path: Path) -> None:
    lib = build_library(tmp_path)
    assert lib.name == "libnvidia-ml.so.1"
    stamp = lib.stat().st_mtime_ns
    assert build_library(tmp_path) == lib
    assert lib.stat().st_mtime_ns == stamp


def test_agent_gpu_prints_driver_cuda_and_devices(nvml_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "world.json"
    write_config(config, gpu_spec())
    env = dict(os.environ, LD_LIBRARY_PATH=str(nvml_dir), SANDBOX_NVML_CONFIG=str(config))
    done = subprocess.run([sys.executable, "-m", "agent", "gpu"], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    out = json.loads(done.stdout)
    assert out["driver"] == "580.95.05" and out["cuda"] == "12.8" and out["error"] is None
    assert [d["uuid"] for d in out["devices"]] == UUIDS
    assert out["devices"][0]["serial"] == "1650123456789" and out["devices"][1]["serial"] is None
    env["LD_LIBRARY_PATH"] = str(tmp_path)  # no library there
    done = subprocess.run([sys.executable, "-m", "agent", "gpu"], env=env, capture_output=True,
                          text=True, timeout=60, check=True)
    out = json.loads(done.stdout)
    assert out["driver"] is None and "libnvidia-ml.so.1 not found" in out["error"]
