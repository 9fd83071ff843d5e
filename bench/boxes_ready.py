"""Sandbox boxes: time from rent to SSH-ready, for 1 box and for 8 rented together.

    sudo .venv/bin/python bench/boxes_ready.py [--rounds 5] [--boxes 2 8] [--api]
    sudo unshare --net sh -c 'ip link set lo up; .venv/bin/python bench/boxes_ready.py --api'

Clocks per box, all from the moment the box is asked for:
  sshd    `NamespaceBackend.start` returned: the box's sshd listens (rounds without logins)
  login   in separate rounds, each box is logged into as soon as its `start` returns: paramiko
          (pyinfra's SSH client, all boxes from this one process, as pyinfra does) with the
          fleet's key, through the public port mapping, runs `true`
  api     with --api: `PUT /api/v0/asks/<id>/` on the fake Vast API, then polling
          `GET /api/v0/instances/<id>/` every 20 ms until it is running with an SSH endpoint,
          then the same login (the world's clock ticks every 50 ms; boot delay set to 0)
A round's figure is its slowest box; the table shows the median over rounds. Rounds are a
second apart, so the kernel's teardown of the last round's namespaces is not counted. CPU is
this process and its children (boxes included, reaped at destroy) per box, in the rounds
without logins.
--api needs the default sandbox network (10.77.0.0/16), which a sandbox that is up holds: the
second form runs the whole benchmark in a network namespace of its own, beside it.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import resource
import statistics
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import _smoke
import paramiko

from sandbox.backend import BoxSpec, GpuDevice, GpuSpec
from sandbox.boxes import NamespaceBackend

BRIDGE, SUBNET, PUBLIC = "flbench0", "10.78.0.0/16", "10.78.1"
Timing = tuple[float, float]  # (ready, login) of a round's slowest box, in seconds


def spec(n: int, key: str) -> BoxSpec:
    gpu = GpuSpec("580.95.05", 12080, [
        GpuDevice(f"GPU-{n:08x}-0000-4000-8000-000000000000", "NVIDIA H100 80GB HBM3",
                  "00000000:1B:00.0", 80 * 2**30, f"13240{n:05d}"),
    ])
    ip = f"{PUBLIC}.{1 + n % 8}"
    return BoxSpec(f"vast-{9000 + n}", "vast", f"C.{9000 + n}",
                   {"VAST_CONTAINERLABEL": f"C.{9000 + n}", "CONTAINER_ID": str(9000 + n),
                    "PUBLIC_IPADDR": ip}, [22, 26611], ip, key, gpu, "echo onstart")


def login(host: str, port: int, key: Path) -> None:
    """Log in as pyinfra does (paramiko, in this process) and run `true`."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    try:
        client.connect(host, port, "root", key_filename=str(key), allow_agent=False,
                       look_for_keys=False, timeout=30)
        _, out, _ = client.exec_command("true")
        if out.channel.recv_exit_status() != 0:
            raise RuntimeError(f"`true` failed on {host}:{port}")
    finally:
        client.close()


def together(count: int, one: Callable[[int], Timing]) -> Timing:
    """Run `one(n)` for n < count in parallel threads; the slowest of each clock."""
    results: list[Timing] = []
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            results.append(one(n))
        except BaseException as e:  # re-raised below, after every thread ended
            errors.append(e)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return max(r[0] for r in results), max(r[1] for r in results)


def direct(backend: NamespaceBackend, pub: str, key: Path, count: int, ssh: bool) -> Timing:
    def one(n: int) -> Timing:
        t0 = time.perf_counter()
        ep = backend.start(spec(n, pub))
        ready = time.perf_counter() - t0
        if ssh:
            login(ep.ssh_host, ep.ssh_port, key)
        return ready, time.perf_counter() - t0

    try:
        return together(count, one)
    finally:
        for n in range(count):
            backend.destroy(spec(n, pub).box_id)


def rounds_of(rounds: int, run: Callable[[], Timing], cpu: list[float]) -> Timing:
    results = []
    for _ in range(rounds):
        time.sleep(1.0)
        before = _cpu()
        results.append(run())
        cpu.append(_cpu() - before)
    return statistics.median(r[0] for r in results), statistics.median(r[1] for r in results)


def _cpu() -> float:
    me, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def api_rounds(tmp: Path, pub: str, key: Path, counts: list[int], rounds: int,
               boot_delay: float = 0.0) -> list[Timing]:
    import httpx

    from sandbox.daemon import Sandbox

    backend = NamespaceBackend(tmp / "api-boxes", bridge="flbench1")
    with Sandbox(backend=backend, boot_delay=boot_delay) as sandbox:
        http = httpx.Client(base_url=sandbox.vast.url, timeout=30,
                            headers={"Authorization": f"Bearer {sandbox.keys.vast}"})
        http.post("/api/v0/ssh/", json={"ssh_key": pub}).raise_for_status()

        def rent(count: int) -> Timing:
            offers = http.post("/api/v0/bundles/", json={"num_gpus": {"eq": 1}}).json()["offers"]
            by_machine = list({o["machine_id"]: o for o in offers}.values())[:count]
            ids: list[int] = []

            def one(n: int) -> Timing:
                t0 = time.perf_counter()
                body = {"image": "sandbox", "disk": 20, "runtype": "ssh_direct",
                        "env": {"-p 26611:26611": "1"}}
                r = http.put(f"/api/v0/asks/{by_machine[n]['id']}/", json=body)
                r.raise_for_status()
                iid = r.json()["new_contract"]
                ids.append(iid)
                while True:
                    row = http.get(f"/api/v0/instances/{iid}/").json()["instances"]
                    if row.get("actual_status") == "running" and row.get("ssh_port"):
                        break
                    time.sleep(0.02)
                ready = time.perf_counter() - t0
                login(row["ssh_host"], row["ssh_port"], key)
                return ready, time.perf_counter() - t0

            try:
                return together(count, one)
            finally:
                for i in ids:
                    http.delete(f"/api/v0/instances/{i}/")
                sandbox.world.settle()

        unused: list[float] = []
        return [rounds_of(rounds, functools.partial(rent, c), unused) for c in counts]


def main() -> None:
    warnings.filterwarnings("ignore", module="paramiko")
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--boxes", type=int, nargs="+", default=[2, 8],
                    help="box counts to compare with one box")
    ap.add_argument("--api", action="store_true", help="also rent through the fake Vast API")
    ap.add_argument("--boot-delay", type=float, default=0.0,
                    help="with --api: the world's provisioning time (the sandbox default is 1 s)")
    ap.add_argument("--direct", action=argparse.BooleanOptionalAction, default=True,
                    help="time NamespaceBackend.start directly (--no-direct: only the API)")
    args = _smoke.parse(ap, rounds=1, boxes=[2], api=True)
    counts = [1, *args.boxes]
    with tempfile.TemporaryDirectory(prefix="boxes-bench-") as tmp_name:
        tmp = Path(tmp_name)
        key = tmp / "id_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        pub = key.with_suffix(".pub").read_text()
        backend = NamespaceBackend(tmp / "boxes", bridge=BRIDGE, subnet=SUBNET)
        cpu: dict[int, list[float]] = {c: [] for c in counts}
        unused: list[float] = []
        try:
            direct(backend, pub, key, 1, True)  # warm-up: page cache, first sshd exec
            rows: list[Timing] = []
            for c in counts if args.direct else []:
                ready = rounds_of(args.rounds,
                                  functools.partial(direct, backend, pub, key, c, False), cpu[c])
                logged = rounds_of(args.rounds,
                                   functools.partial(direct, backend, pub, key, c, True), unused)
                rows.append((ready[0], logged[1]))
        finally:
            backend.close()
        api = api_rounds(tmp, pub, key, counts, args.rounds, args.boot_delay) if args.api else None
    print(f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"rounds: {args.rounds} (median of each round's slowest box)\n")
    head = "| boxes | start() returned (sshd listens) | SSH login done | CPU per box |"
    if api:
        head += " API rent -> running | API rent -> SSH login |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    if not rows:  # --no-direct
        rows = [(float("nan"), float("nan"))] * len(counts)
        cpu = {c: [float("nan")] for c in counts}
    if args.api:
        print(f"API boot delay (provider provisioning): {args.boot_delay:g} s")
    for i, c in enumerate(counts):
        line = (f"| {c} | {rows[i][0] * 1000:.0f} ms | {rows[i][1] * 1000:.0f} ms | "
                f"{statistics.median(cpu[c]) / c * 1000:.0f} ms |")
        if api:
            line += f" {api[i][0] * 1000:.0f} ms | {api[i][1] * 1000:.0f} ms |"
        print(line)
    for i, c in enumerate(counts[1:], 1):
        ratio = f"| ratio {c}:1 | {rows[i][0] / rows[0][0]:.2f} | {rows[i][1] / rows[0][1]:.2f} | |"
        if api:
            ratio += f" {api[i][0] / api[0][0]:.2f} | {api[i][1] / api[0][1]:.2f} |"
        print(ratio)


if __name__ == "__main__":
    main()
