"""The agent's NVML code against a real NVIDIA GPU and driver (run it on a GPU machine, from the
repository root, with any python3 that has nvidia-ml-py and psutil):

    python3 bench/nvml_device.py

It prints, as JSON lines: what `nvidia-smi` says of the GPUs, what the agent reads through NVML
(`agent.gpu.read_gpu`, timed cold and warm), the admission verdicts on the machine's own
driver and UUIDs and on wrong ones, and one admission check through the agent's NVML thread
(`agent.nvmlcheck`). It exits 1 when the agent's reading disagrees with nvidia-smi or a
verdict is not the expected one. No GPU is needed to build or test the project; this is the
check that the stand-in NVML (sandbox/nvml) and the real library agree on what the agent uses.

    python3 bench/nvml_device.py --smoke

runs the same checks on a machine without a GPU, against the stand-in NVML (built with gcc),
whose GPUs stand where nvidia-smi's would: CI's check that this script still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _smoke  # noqa: E402

from agent.base import gpu  # noqa: E402
from agent.daemon.nvmlcheck import AdmissionChecks  # noqa: E402

STANDIN_WORLD = "SANDBOX_NVML_CONFIG"  # set: this process runs on the stand-in NVML

SMI_FIELDS = "driver_version,uuid,name,serial,pci.bus_id,memory.total"


def say(what: str, **data: object) -> None:
    print(json.dumps({"what": what, **data}, default=str), flush=True)


def smi() -> list[dict[str, str]]:
    if not shutil.which("nvidia-smi"):
        return []
    out = subprocess.run(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=60).stdout
    return [dict(zip(SMI_FIELDS.split(","), (c.strip() for c in line.split(",")), strict=False))
            for line in out.splitlines() if line.strip()]


def standin(work: Path) -> list[dict[str, str]]:
    """Run this script again on the stand-in NVML; return its GPUs as nvidia-smi names them."""
    from sandbox.backend import GpuDevice, GpuSpec
    from sandbox.nvml import CONFIG_ENV, build_library, write_config

    world = GpuSpec("580.95.05", 13000, [
        GpuDevice(f"GPU-8c4f2a1e-5b7d-4e2a-9f31-00000000000{i}", "NVIDIA H200",
                  f"00000000:{0x1B + i:02X}:00.0", 150754820096, f"165000000000{i}")
        for i in range(2)])
    write_config(work / "nvml.json", world)
    lib = build_library(work / "lib").parent
    env = {**os.environ, CONFIG_ENV: str(work / "nvml.json"),
           "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}".rstrip(":")}
    os.execve(sys.executable, [sys.executable, __file__, "--smoke"], env)


def expected_cards() -> list[dict[str, str]]:
    """nvidia-smi's GPUs, or on the stand-in the world it was given."""
    if STANDIN_WORLD not in os.environ:
        return smi()
    world = json.loads(Path(os.environ[STANDIN_WORLD]).read_text())
    return [{"driver_version": world["driver_version"], "uuid": d["uuid"], "name": d["name"]}
            for d in world["devices"]]


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    args = _smoke.parse(ap)
    if args.smoke and STANDIN_WORLD not in os.environ:
        standin(Path(tempfile.mkdtemp(prefix="nvml-smoke-")))  # never returns
    failures: list[str] = []
    cards = expected_cards()
    if args.smoke and not cards:
        failures.append("the stand-in reported no GPU")
    say("stand-in NVML's world" if STANDIN_WORLD in os.environ else "nvidia-smi", gpus=cards)
    timings = []
    facts = gpu.read_gpu()
    for _ in range(3):
        t0 = time.perf_counter()
        facts = gpu.read_gpu()
        timings.append(round(time.perf_counter() - t0, 4))
    say("agent read_gpu", facts=facts.as_dict(), seconds=timings)
    cli = subprocess.run([sys.executable, "-m", "agent", "gpu"], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parent.parent)
    say("python -m agent gpu", rc=cli.returncode, output=json.loads(cli.stdout or "null"))
    if cli.returncode != 0 or json.loads(cli.stdout or "null") != facts.as_dict():
        failures.append(f"`python -m agent gpu` answered otherwise (exit {cli.returncode})")
    if facts.error:
        failures.append(f"NVML read failed: {facts.error}")
    if cards:
        if facts.driver != cards[0]["driver_version"]:
            failures.append(f"driver {facts.driver} != nvidia-smi {cards[0]['driver_version']}")
        if [d["uuid"] for d in facts.devices] != [c["uuid"] for c in cards]:
            failures.append("UUIDs differ from nvidia-smi's")
    uuids = [d["uuid"] for d in facts.devices]
    driver = facts.driver or ""
    expected = [
        ("its own driver", driver, [], True),
        ("its own driver and UUIDs", driver, uuids, True),
        ("another driver", "580.95.05" if driver != "580.95.05" else "570.0.0", [], False),
        ("an unqualified GPU", driver, ["GPU-00000000-0000-4000-8000-000000000000"], False),
    ]
    for name, wanted, qualified, ok in expected:
        v = gpu.admit(facts, wanted, qualified)
        say("admission", case=name, admitted=v.admitted, reason=v.reason)
        if v.admitted != ok:
            failures.append(f"admission on {name}: {v.admitted}, wanted {ok} ({v.reason})")
    checks = AdmissionChecks(lambda: gpu.admit(gpu.read_gpu(), driver, uuids),
                             gpu.not_yet(driver, uuids))
    t0 = time.perf_counter()
    checks.request()
    answered = checks.wait(30.0)
    v = checks.verdict
    say("admission through the NVML thread", answered=answered, admitted=v.admitted,
        pending=v.pending, reason=v.reason, seconds=round(time.perf_counter() - t0, 4))
    if not (answered and v.admitted and not v.pending):
        failures.append(f"the NVML thread's check: answered={answered}, {v.reason}")
    say("result", ok=not failures, failures=failures)
    if STANDIN_WORLD in os.environ and args.smoke:  # the stand-in's folder, made by standin()
        shutil.rmtree(Path(os.environ[STANDIN_WORLD]).parent, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
