"""GPU facts through AMD SMI: the amdsmi binding of ROCm's libamd_smi.so.

The binding binds every symbol of the library when imported, so a box without ROCm (the
library missing) fails the import itself; it is one refusal among the others. Every failure
(import, init with amdgpu not loaded, a library error, retry or timeout, no GPU, anything
unexpected) comes back as GpuFacts.error, never raised. A call that hangs is the caller's to
outlive (daemon/nvmlcheck.py runs each check in a thread of its own).

The ROCm release is read with amdsmi_get_rocm_version, which asks ROCm's librocm-core.so, the
library that carries the release on a real install (the same answer `amd-smi version` gives);
/opt/rocm/.info/version is a text file a container image may not match to the libraries it
ships, so it is not read.

Each reading runs in a child process of its own: a process keeps the libamd_smi.so and
librocm-core.so it loaded first (the dynamic loader hands back a loaded library for its path),
so an agent reading in its own process would go on answering the ROCm release it started on
through an upgrade. A child that does not answer within READ_TIMEOUT_S is killed: a refusal.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent.base.gpu_facts import GpuFacts

READ_TIMEOUT_S = 120.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where `agent` is importable from


def read_amd_gpu(timeout_s: float = READ_TIMEOUT_S) -> GpuFacts:
    """The AMD GPU facts, read afresh by a child process (never raises)."""
    path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
    try:
        done = subprocess.run([sys.executable, "-m", "agent.base.amdgpu"], capture_output=True,
                              text=True, timeout=timeout_s, env={**os.environ,
                                                                 "PYTHONPATH": path})
    except subprocess.TimeoutExpired:
        return _refused(f"AMD SMI did not answer in {timeout_s:g} s (hung?)")
    except OSError as e:
        return _failed("AMD SMI reader could not start", e)
    try:
        d = json.loads(done.stdout.splitlines()[-1])  # the last line: the binding may talk
        return GpuFacts(driver=d["driver"], devices=d["devices"], error=d["error"],
                        vendor="amd", rocm=d["rocm"])
    except (ValueError, KeyError, TypeError, IndexError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return _refused(f"AMD SMI reader failed (exit {done.returncode}): {last}")


def read_here() -> GpuFacts:
    """The AMD GPU facts read in this process (the child's part of read_amd_gpu)."""
    try:
        # the wrapper prints its "Unable to find libamd_smi.so" to stdout: never into the
        # JSON the CLI prints, nor into the agent's output
        with contextlib.redirect_stdout(io.StringIO()):
            import amdsmi
    except ModuleNotFoundError as e:
        if e.name != "amdsmi":
            return _failed("AMD SMI library not loadable", e)
        return _refused("the amdsmi binding is not installed")
    except Exception as e:  # a missing libamd_smi.so surfaces as the wrapper's KeyError
        return _failed("AMD SMI library libamd_smi.so not loadable (no ROCm here?)", e)
    try:
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except Exception as e:
        return _failed("AMD SMI init failed (amdgpu not loaded?)", e)
    try:
        return _read(amdsmi)
    except Exception as e:
        return _failed("AMD SMI query failed", e)
    finally:
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def _read(amdsmi: Any) -> GpuFacts:
    handles = amdsmi.amdsmi_get_processor_handles()
    if not handles:
        return _refused("AMD SMI sees no GPU")
    # one amdgpu module drives every GPU; GPUs that disagree cannot be admitted on one version
    drivers = sorted({amdsmi.amdsmi_get_gpu_driver_info(h)["driver_version"] for h in handles})
    if len(drivers) != 1:
        return _refused(f"the GPUs report different amdgpu drivers: {', '.join(drivers)}")
    ok, rocm = amdsmi.amdsmi_get_rocm_version()
    if not ok:
        return _refused(f"ROCm version unreadable: {rocm}")
    devices = [_device(amdsmi, i, h) for i, h in enumerate(handles)]
    return GpuFacts(driver=drivers[0], devices=devices, vendor="amd", rocm=rocm)


def _device(amdsmi: Any, index: int, handle: Any) -> dict[str, Any]:
    def optional(fn: Any, *args: Any) -> Any:
        try:
            return fn(handle, *args)
        except amdsmi.AmdSmiException:
            return None

    asic = optional(amdsmi.amdsmi_get_gpu_asic_info) or {}
    board = optional(amdsmi.amdsmi_get_gpu_board_info) or {}
    serial = board.get("product_serial")
    return {
        "index": index,
        "uuid": amdsmi.amdsmi_get_gpu_device_uuid(handle),
        "name": asic.get("market_name"),
        "serial": None if serial in (None, "N/A") else serial,
        "pci_bus_id": optional(amdsmi.amdsmi_get_gpu_device_bdf),
        "memory_total": optional(amdsmi.amdsmi_get_gpu_memory_total,
                                 amdsmi.AmdSmiMemoryType.VRAM),
    }


def _refused(reason: str) -> GpuFacts:
    return GpuFacts(error=reason, vendor="amd")


def _failed(what: str, e: BaseException) -> GpuFacts:
    detail = " ".join(str(e).split())  # the binding's messages span lines
    return _refused(f"{what}: {type(e).__name__}: {detail}" if detail else
                    f"{what}: {type(e).__name__}")


if __name__ == "__main__":
    print(json.dumps(read_here().as_dict()))
