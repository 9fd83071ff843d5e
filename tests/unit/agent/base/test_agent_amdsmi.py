"""The stand-in libamd_smi.so (and librocm-core.so), loaded by the unchanged amdsmi binding in a
child process, as the agent loads it on an AMD box."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agentbox import AMD_UUIDS, amd_gpu_spec

from sandbox.standin import write_world

PROBE = textwrap.dedent("""
    import json
    import amdsmi as a
    out = {}
    try:
        a.amdsmi_init()
    except a.AmdSmiLibraryException as e:
        print(json.dumps({"init_error": e.get_error_code()}))
        raise SystemExit(0)
    hs = a.amdsmi_get_processor_handles()
    out["devices"] = [{
        "driver": a.amdsmi_get_gpu_driver_info(h),
        "market_name": a.amdsmi_get_gpu_asic_info(h)["market_name"],
        "board": a.amdsmi_get_gpu_board_info(h)["product_name"],
        "serial": a.amdsmi_get_gpu_board_info(h)["product_serial"],
        "uuid": a.amdsmi_get_gpu_device_uuid(h),
        "bdf": a.amdsmi_get_gpu_device_bdf(h),
        "vram": a.amdsmi_get_gpu_memory_total(h, a.AmdSmiMemoryType.VRAM),
    } for h in hs]
    try:
        a.amdsmi_get_gpu_activity(hs[0])
    except a.AmdSmiLibraryException as e:
        out["activity"] = e.get_error_code()
    out["rocm"] = a.amdsmi_get_rocm_version()
    a.amdsmi_shut_down()
    try:
        a.amdsmi_get_processor_handles()
    except a.AmdSmiLibraryException as e:
        out["after_shut_down"] = e.get_error_code()
    print(json.dumps(out))
""")


def probe(rocm_dir: Path, config: Path) -> dict:
    env = dict(os.environ, ROCM_PATH=str(rocm_dir), SANDBOX_AMDSMI_CONFIG=str(config))
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def test_amdsmi_reads_the_configured_world(rocm_dir: Path, tmp_path: Path) -> None:
    write_world(tmp_path / "world.json", amd_gpu_spec())
    out = probe(rocm_dir, tmp_path / "world.json")
    first, second = out["devices"]
    assert first["driver"] == {"driver_name": "amdgpu", "driver_version": "6.12.12",
                               "driver_date": "N/A"}
    assert [d["uuid"] for d in out["devices"]] == AMD_UUIDS
    assert first["market_name"] == first["board"] == "AMD Instinct MI300X"
    assert (first["serial"], second["serial"]) == ("692251001234", "N/A")
    assert (first["bdf"], second["bdf"]) == ("0000:1b:00.0", "0000:1c:00.0")
    assert first["vram"] == 206158430208
    assert out["activity"] == 2  # every other call: AMDSMI_STATUS_NOT_SUPPORTED
    assert out["rocm"] == [True, "6.4.1"]
    assert out["after_shut_down"] == 32  # AMDSMI_STATUS_NOT_INIT


def test_a_missing_world_is_amdgpu_not_loaded_and_a_change_shows_at_the_next_init(
        rocm_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "world.json"
    assert probe(rocm_dir, config) == {"init_error": 34}  # AMDSMI_STATUS_DRIVER_NOT_LOADED
    write_world(config, amd_gpu_spec(driver="6.12.10", rocm="6.3.3"))
    out = probe(rocm_dir, config)
    assert out["devices"][0]["driver"]["driver_version"] == "6.12.10"
    assert out["rocm"] == [True, "6.3.3"]


def test_the_stubs_cover_every_symbol_the_binding_binds(tmp_path: Path) -> None:
    import shutil

    from sandbox.amdsmi import gen_stubs

    shutil.copy(gen_stubs.HERE / "amdsmi.c", tmp_path / "amdsmi.c")
    gen_stubs.write(tmp_path / "amdsmi.c")
    assert (tmp_path / "stubs.c").read_text() == (gen_stubs.HERE / "stubs.c").read_text()
    assert len(gen_stubs.wanted_symbols()) > 150


def _rocm_core_of(release: tuple[int, int, int], lib_dir: Path) -> None:
    """A librocm-core.so with its release compiled in, as ROCm's own is, swapped in whole."""
    src = lib_dir / "rocm_core_fixed.c"
    a, b, c = release
    src.write_text("unsigned int getROCmVersion(unsigned int *a, unsigned int *b, "
                   f"unsigned int *c) {{ *a = {a}; *b = {b}; *c = {c}; return 0; }}\n")
    tmp = lib_dir / ".librocm-core.so.new"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp), str(src)], check=True)
    os.replace(tmp, lib_dir / "librocm-core.so")


def test_a_rocm_upgrade_under_a_running_agent_is_read_at_its_next_check(
        rocm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process keeps the librocm-core.so it loaded first; the agent's reading must not."""
    from agent.base import gpu

    lib = tmp_path / "rocm" / "lib"
    lib.mkdir(parents=True)
    os.symlink(rocm_dir / "lib" / "libamd_smi.so", lib / "libamd_smi.so")
    config = tmp_path / "amdsmi.json"
    write_world(config, amd_gpu_spec())
    monkeypatch.setenv("ROCM_PATH", str(tmp_path / "rocm"))
    monkeypatch.setenv("SANDBOX_AMDSMI_CONFIG", str(config))
    _rocm_core_of((6, 4, 1), lib)
    assert gpu.read_facts("amd").rocm == "6.4.1"
    _rocm_core_of((6, 4, 2), lib)
    after = gpu.check("amd", amd_gpu_spec().driver_version, "6.4.1", [])
    assert not after.admitted and "ROCm 6.4.2" in after.reason
