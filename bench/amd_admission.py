"""One admission check on the stand-in AMD SMI beside the same check on the stand-in NVML, on
one machine in one run: what GPU admission costs on an AMD box (read every reconcile), against
the NVIDIA figure. From the repository root:

    python3 bench/amd_admission.py [--checks 300]

Each vendor runs in a process of its own (the libraries are found through the environment a
process starts with: LD_LIBRARY_PATH for NVML, ROCM_PATH for AMD SMI), against a world of two
GPUs; each check is `agent.base.gpu.check` as the supervisor's admission thread calls it (the
library's init, the driver (and ROCm) versions, every GPU's identity, shutdown). The first check
(cold: the binding's import and the library's load) is reported apart; the median and p90 are
of the rest. It prints one JSON line per vendor and one with the AMD/NVIDIA ratio of medians,
and exits 1 if a check is not admitted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import _smoke  # noqa: E402

from sandbox.backend import GpuDevice, GpuSpec  # noqa: E402

DRIVERS = {"nvidia": ("580.95.05", ""), "amd": ("6.12.12", "6.4.1")}


def world(vendor: str) -> GpuSpec:
    driver, rocm = DRIVERS[vendor]
    if vendor == "amd":
        return GpuSpec(driver, 0, [
            GpuDevice(f"a1ff74a1-0000-1000-80fd-5fe0a2f6c3b{i}", "AMD Instinct MI300X",
                      f"0000:{0x1B + i:02x}:00.0", 206158430208) for i in range(2)],
            vendor="amd", rocm_version=rocm)
    return GpuSpec(driver, 13000, [
        GpuDevice(f"GPU-8c4f2a1e-5b7d-4e2a-9f31-00000000000{i}", "NVIDIA H200",
                  f"00000000:{0x1B + i:02X}:00.0", 150754820096) for i in range(2)])


def environment(vendor: str, work: Path) -> dict[str, str]:
    from sandbox import amdsmi, nvml
    from sandbox.standin import write_world

    config = work / f"{vendor}.json"
    write_world(config, world(vendor))
    if vendor == "amd":
        amdsmi.build_libraries(work / "rocm" / "lib")
        return {**os.environ, "ROCM_PATH": str(work / "rocm"), amdsmi.CONFIG_ENV: str(config)}
    lib = nvml.build_library(work / "nvml").parent
    return {**os.environ, "LD_LIBRARY_PATH": str(lib), nvml.CONFIG_ENV: str(config)}


def measure(vendor: str, checks: int) -> dict[str, object]:
    """In this process (started by run_vendor): time `checks` admission checks."""
    from agent.base import gpu

    driver, rocm = DRIVERS[vendor]
    times, refused = [], []
    for _ in range(checks):
        start = time.perf_counter()
        verdict = gpu.check(vendor, driver, rocm, [])
        times.append(time.perf_counter() - start)
        if not verdict.admitted:
            refused.append(verdict.reason)
    warm = sorted(times[1:])
    return {"what": "admission check", "vendor": vendor, "library": gpu.READER[vendor],
            "checks": checks, "cold_ms": round(times[0] * 1000, 3),
            "median_ms": round(statistics.median(warm) * 1000, 3),
            "p90_ms": round(warm[int(0.9 * (len(warm) - 1))] * 1000, 3),
            "refused": refused[:3]}


def run_vendor(vendor: str, checks: int, work: Path) -> dict[str, object]:
    done = subprocess.run([sys.executable, __file__, "--measure", vendor, "--checks",
                           str(checks)], env=environment(vendor, work), capture_output=True,
                          text=True, timeout=600, check=True)
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checks", type=int, default=300, help="checks per vendor (default 300)")
    ap.add_argument("--measure", choices=sorted(DRIVERS), help=argparse.SUPPRESS)
    args = _smoke.parse(ap, checks=5)
    if args.measure:
        print(json.dumps(measure(args.measure, args.checks)))
        return 0
    if args.checks < 2:
        print("error: --checks must be at least 2", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="amd-admission-") as tmp:
        results = {v: run_vendor(v, args.checks, Path(tmp)) for v in ("nvidia", "amd")}
    for result in results.values():
        print(json.dumps(result))
    nvidia, amd = (float(str(results[v]["median_ms"])) for v in ("nvidia", "amd"))
    ok = not any(r["refused"] for r in results.values())
    print(json.dumps({"what": "result", "ok": ok, "ratio_amd_to_nvidia": round(amd / nvidia, 2)}))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
