"""Inventory of 1,000 boxes: list 500 RunPod pods and 500 Vast instances into Box objects.

    .venv/bin/python bench/inventory_1000.py [--boxes 500] [--rounds 7]

Starts a sandbox daemon (null backend) in a temporary state dir, rents the boxes in bulk
through the control surface (`POST /instances`), lets them boot so every row carries its ports,
then times the provider clients as fleet uses them: `all_providers()` built from the sandbox's
environment, then `boxes()` on each, RunPod in one `myself { pods }` query, Vast through
`GET /api/v1/instances/` 25 a page. A round is both providers, one after the other; the figure
is the median round. Target: <= 2 s for 1,000 boxes.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _smoke
import psutil

from fleet.boxes.inventory import build as build_inventory
from fleet.core.boxes import Row
from fleet.core.config import load as load_config
from fleet.core.times import now_iso
from fleet.providers.factory import all_providers
from fleet.state.registry import Registry
from sandbox import manage
from sandbox.control_client import ControlClient

TARGET_S = 2.0


CONFIG = """
[fleet]
registry = "{state}/boxes.json"
known_hosts = "{state}/known_hosts"
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
p2p_port = 26611
"""


def machine() -> str:
    ram = psutil.virtual_memory().total / 2**30
    try:
        distro = platform.freedesktop_os_release().get("PRETTY_NAME", "")
    except OSError:
        distro = ""
    kernel = f"{platform.system()} {platform.release()}"
    return f"{os.cpu_count()} cores, {ram:.0f} GiB RAM, {distro} ({kernel})".replace(" ()", "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--boxes", type=int, default=500, help="boxes per provider")
    ap.add_argument("--rounds", type=int, default=7)
    args = _smoke.parse(ap, boxes=30, rounds=2)  # Vast: two pages

    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        try:
            manage.up(state, boot_delay=0.0, machines_per_provider=args.boxes + 20)
            os.environ.update(manage.load_env(state))
            with ControlClient(os.environ["FLEET_SANDBOX_CONTROL"], timeout=120) as control:
                for provider in ("runpod", "vast"):
                    control.create_instances(provider, args.boxes, label_prefix=f"inv-{provider}",
                                             tcp_ports=[22, 26611])
                control.advance(1.0)
                control.settle(60.0)
                listed = control.instances()
            # the registry the fleet would hold for these boxes, so the full inventory (listing,
            # matching by label, host data, known_hosts) can be timed as pyinfra gets it
            cfg_path = state / "fleet.toml"
            cfg_path.write_text(CONFIG.format(state=state))
            cfg = load_config(cfg_path)
            with Registry(cfg.registry).transaction() as rows:
                for inst in listed:
                    rows[inst["label"]] = Row(
                        label=inst["label"], provider=inst["provider"], role="live",
                        kind="standing", card="RTX 4090", gpu_count=1, usd_per_hour=0.3,
                        status="running", provider_id=str(inst["id"]),
                        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIbench", created_at=now_iso())
            rounds: list[dict[str, float]] = []
            counts: dict[str, int] = {}
            ready: dict[str, int] = {}
            for _ in range(args.rounds):
                times: dict[str, float] = {}
                t0 = time.perf_counter()
                providers = all_providers()
                for name, p in providers.items():
                    t = time.perf_counter()
                    boxes = p.boxes()
                    times[name] = time.perf_counter() - t
                    counts[name] = len(boxes)
                    ready[name] = sum(1 for b in boxes if b.ssh_ready)
                times["total"] = time.perf_counter() - t0
                t = time.perf_counter()
                built = build_inventory(cfg, all_providers())
                times["inventory"] = time.perf_counter() - t
                hosts = len(built.groups.get("standing", []))
                rounds.append(times)
        finally:
            manage.down(state)

    assert counts == {"runpod": args.boxes, "vast": args.boxes}, counts
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    best = min(r["total"] for r in rounds)
    worst = max(r["total"] for r in rounds)
    total = sum(counts.values())
    verdict = "meets" if med["total"] <= TARGET_S else "MISSES"
    print(f"date: {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}")
    print(f"machine: {machine()}; Python {platform.python_version()}")
    print(f"boxes: {total} ({args.boxes} RunPod in one query, {args.boxes} Vast in "
          f"{-(-args.boxes // 25)} pages of 25); rounds: {args.rounds}")
    print(f"median round: {med['total']:.3f} s (RunPod {med['runpod']:.3f} s, "
          f"Vast {med['vast']:.3f} s); best {best:.3f} s, worst {worst:.3f} s")
    print(f"SSH-ready as listed: RunPod {ready['runpod']}, Vast {ready['vast']}")
    print(f"full inventory (fleet.boxes.inventory.build: listing + registry match + host data + "
          f"known_hosts), median: {med['inventory']:.3f} s for {hosts} hosts")
    print(f"target <= {TARGET_S:.1f} s: {verdict}")


if __name__ == "__main__":
    main()
