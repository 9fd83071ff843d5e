#!/usr/bin/env python3
"""igneum-miner: the sandbox's stand-in for the CUDA worker (stdlib only, one file).

Usage:
  igneum-miner --node-rpc URL --pack DIR --status-file FILE [--invocations FILE]
  igneum-miner export-pack --node-rpc URL --pack DIR
  igneum-miner --version

A run first appends one JSON line to the invocations file (default: miner-invocations.log beside
the pack directory), then asks NVML (ctypes, libnvidia-ml.so.1) how many GPUs it may use,
honouring CUDA_VISIBLE_DEVICES as CUDA does; on a box without NVML, AMD SMI (libamd_smi.so,
where ROCm puts it), honouring HIP_VISIBLE_DEVICES as HIP does. Neither library, or no GPU: one
line on stderr, exit 3.
Otherwise, every second: read the node's seed from URL/status, compare it with DIR/pack.json,
and write the status file. A pack for another seed is a stale pack: hash rate 0 until the pack
is re-exported and the miner restarted. SIGTERM exits 0.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import math
import os
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

VERSION = "dev"  # stamped by sandbox.releases

HASHES_PER_GPU = 1.0e8  # simulated H/s per admitted GPU
EXIT_REFUSED = 3
STOP = threading.Event()


def log(msg: str, err: bool = False) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} igneum-miner {msg}", file=sys.stderr if err else sys.stdout, flush=True)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def node_seed(rpc: str) -> str:
    """The node's current seed; OSError/ValueError when the node can't say."""
    url = rpc if rpc.rstrip("/").endswith("/status") else rpc.rstrip("/") + "/status"
    with urllib.request.urlopen(url, timeout=2.0) as resp:
        seed = json.loads(resp.read())["seed"]
    if not isinstance(seed, str) or not seed:
        raise ValueError("the node reported no seed")
    return seed


def pack_seed(pack: Path) -> str:
    try:
        seed = json.loads((pack / "pack.json").read_text()).get("seed", "")
    except (OSError, ValueError, AttributeError):
        return ""
    return seed if isinstance(seed, str) else ""


def visible_gpus() -> tuple[int, str]:
    """(GPUs this process may use, why none) from NVML and CUDA_VISIBLE_DEVICES, or on an AMD
    box (no NVML) from AMD SMI and HIP_VISIBLE_DEVICES."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError as exc:
        amd = _amd_smi()
        if amd is None:
            return 0, f"NVML library not loadable ({exc}), nor AMD SMI"
        return _amd_visible_gpus(amd)
    try:
        rc = nvml.nvmlInit_v2()
    except AttributeError:
        return 0, "NVML has no nvmlInit_v2"
    if rc != 0:
        return 0, f"nvmlInit_v2 failed (NVML error {rc})"
    try:
        count = ctypes.c_uint(0)
        rc = nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != 0:
            return 0, f"nvmlDeviceGetCount_v2 failed (NVML error {rc})"
        n = _apply_visible_devices(nvml, count.value, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if n == 0:
            return 0, f"NVML shows {count.value} device(s), none admitted to this process"
        return n, ""
    finally:
        nvml.nvmlShutdown()


def _apply_visible_devices(nvml: Any, count: int, env: str | None) -> int:
    """CUDA's rule: entries (index or UUID) in order, stopping at the first that matches none."""
    if env is None:
        return count
    uuids: list[str] = []
    chosen: set[int] = set()
    for entry in (e.strip() for e in env.split(",")):
        if entry.isdigit() and int(entry) < count:
            chosen.add(int(entry))
            continue
        if entry.startswith("GPU-"):
            if not uuids:
                uuids = [_uuid(nvml, i) for i in range(count)]
            matches = [i for i, u in enumerate(uuids) if u.startswith(entry)]
            if len(matches) == 1:
                chosen.add(matches[0])
                continue
        break
    return len(chosen)


def _uuid(nvml: Any, index: int) -> str:
    handle = ctypes.c_void_p()
    buf = ctypes.create_string_buffer(96)
    if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) != 0:
        return ""
    if nvml.nvmlDeviceGetUUID(handle, buf, len(buf)) != 0:
        return ""
    return buf.value.decode(errors="replace")


AMDSMI_INIT_AMD_GPUS = 2


def _amd_smi() -> Any:
    """libamd_smi.so where ROCm installs it ($ROCM_PATH/lib, else /opt/rocm/lib), or None."""
    for rocm in (os.environ.get("ROCM_PATH"), "/opt/rocm"):
        if rocm:
            try:
                return ctypes.CDLL(os.path.join(rocm, "lib", "libamd_smi.so"))
            except OSError:
                continue
    return None


def _amd_visible_gpus(amd: Any) -> tuple[int, str]:
    rc = amd.amdsmi_init(ctypes.c_uint64(AMDSMI_INIT_AMD_GPUS))
    if rc != 0:
        return 0, f"amdsmi_init failed (AMD SMI status {rc})"
    try:
        sockets = ctypes.c_uint32(0)
        if amd.amdsmi_get_socket_handles(ctypes.byref(sockets), None) != 0:
            return 0, "amdsmi_get_socket_handles failed"
        handles = (ctypes.c_void_p * max(sockets.value, 1))()
        if amd.amdsmi_get_socket_handles(ctypes.byref(sockets), handles) != 0:
            return 0, "amdsmi_get_socket_handles failed"
        total = 0
        for i in range(sockets.value):
            count = ctypes.c_uint32(0)
            if amd.amdsmi_get_processor_handles(ctypes.c_void_p(handles[i]), ctypes.byref(count),
                                                None) != 0:
                return 0, "amdsmi_get_processor_handles failed"
            total += count.value
        env = os.environ.get("HIP_VISIBLE_DEVICES")
        # HIP's rule for indices: in order, stopping at the first that names no device
        n = total if env is None else len(set(_leading_indices(env, total)))
        if n == 0:
            return 0, f"AMD SMI shows {total} device(s), none admitted to this process"
        return n, ""
    finally:
        amd.amdsmi_shut_down()


def _leading_indices(env: str, count: int) -> list[int]:
    out: list[int] = []
    for entry in (e.strip() for e in env.split(",")):
        if not (entry.isdigit() and int(entry) < count):
            break
        out.append(int(entry))
    return out


def export_pack(args: argparse.Namespace) -> int:
    try:
        seed = node_seed(args.node_rpc)
    except (OSError, ValueError, KeyError) as exc:
        print(f"igneum-miner: export-pack failed: node at {args.node_rpc}: {exc}", file=sys.stderr)
        return 1
    pack: Path = args.pack
    write_json_atomic(pack / "pack.json", {"seed": seed, "version": VERSION, "ts": time.time()})
    print(f"igneum-miner: exported pack for seed {seed} to {pack / 'pack.json'}")
    return 0


def record_invocation(path: Path, argv: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    line = json.dumps({"ts": stamp, "pid": os.getpid(), "version": VERSION, "argv": argv})
    with open(path, "a") as f:
        f.write(line + "\n")


def mine(args: argparse.Namespace) -> int:
    gpus, why = visible_gpus()
    if gpus == 0:
        print(f"igneum-miner: refusing to run: no admitted GPU: {why}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    log(f"{VERSION} up: {gpus} GPU(s), node {args.node_rpc}, pack {args.pack}")
    last_state = ""
    while not STOP.is_set():
        try:
            seed = node_seed(args.node_rpc)
        except (OSError, ValueError, KeyError) as exc:
            seed, state = "", f"waiting_for_node ({exc})"
        ours = pack_seed(args.pack)
        if seed and ours == seed:
            state = f"mining seed {seed}"
            wobble = 1.0 + 0.02 * math.sin(time.time() / 7.0)
            hashrate = round(gpus * HASHES_PER_GPU * wobble, 1)
        else:
            if seed:
                state = f"stale_pack: pack seed {ours or '(none)'}, node seed {seed}"
            hashrate = 0.0
        if state != last_state:
            log(state)
            last_state = state
        status = {"hashrate": hashrate, "seed": seed, "pack_seed": ours, "gpus": gpus,
                  "ts": time.time()}
        write_json_atomic(args.status_file, status)
        STOP.wait(1.0)
    log("SIGTERM: stopping")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="igneum-miner", description="Igneum miner (sandbox simulator)")
    p.add_argument("--version", action="version", version=f"igneum-miner {VERSION}")
    if argv[:1] == ["export-pack"]:
        p.add_argument("command", choices=["export-pack"])
        p.add_argument("--node-rpc", required=True)
        p.add_argument("--pack", required=True, type=Path)
        return p.parse_args(argv)
    p.add_argument("--node-rpc", required=True, help="the node's RPC base URL")
    p.add_argument("--pack", required=True, type=Path, help="the pack directory")
    p.add_argument("--status-file", required=True, type=Path)
    p.add_argument("--invocations", type=Path,
                   help="invocation log (default: miner-invocations.log beside the pack dir)")
    args = p.parse_args(argv)
    args.command = "mine"
    return args


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    signal.signal(signal.SIGINT, lambda *_: STOP.set())
    if args.command == "export-pack":
        return export_pack(args)
    pack_parent = args.pack.absolute().parent
    record_invocation(args.invocations or pack_parent / "miner-invocations.log", argv)
    return mine(args)


if __name__ == "__main__":
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
