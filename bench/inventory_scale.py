"""The full inventory over 1,000 and 10,000 registry rows, in-process, without a provider API.

    .venv/bin/python bench/inventory_scale.py [--sizes 1000 10000] [--rounds 3] [--unreadable]
                                              [--smoke]

Per size N: a registry of N live standing boxes (half RunPod, half Vast, each with its SSH
endpoint and host key) and, for each provider, an in-memory listing of its boxes, all
running (the unit tests' way: no HTTP, no SSH). Timed: `fleet.boxes.inventory.build`, what
`pyinfra inventory.py` loads (listing matched against the registry, host data, known_hosts),
in a fresh process each round as pyinfra runs it: `cold` is the process's first build (the
registry read from its file), `warm` a second one in the same process. The figures are the
median round, printed as JSON; each build is checked to yield every box as a host.
`--unreadable`: every listing row is one the client could not read (a listing format it no
longer reads), so the build yields no host and every row is unsure.

To compare with the code before a change, run the same command in a checkout of that commit.
bench/inventory_1000.py times the same build with the sandbox's provider APIs listing.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _smoke

CONFIG = """
[fleet]
registry = "{state}/boxes.json"
known_hosts = "{state}/known_hosts"
ssh_key = "{state}/fleet_key"
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
p2p_port = 26611
programs = ["node"]
"""


class Listing:
    """A provider whose listing is a list in memory (as the unit tests' fakes)."""

    def __init__(self, name: str, boxes: list[Any]) -> None:
        self.name = name
        self._boxes = boxes

    def boxes(self) -> list[Any]:
        return list(self._boxes)

    def box(self, box_id: str) -> None:
        raise AssertionError(f"every box is listed; none is asked for by id ({box_id})")


def fill(state: Path, n: int) -> Path:
    """The registry of n live boxes, and the config naming it."""
    from fleet.core.boxes import Row
    from fleet.core.config import load
    from fleet.state.registry import Registry

    cfg_path = state / "fleet.toml"
    cfg_path.write_text(CONFIG.format(state=state))
    cfg = load(cfg_path)
    with Registry(cfg.registry).transaction() as rows:
        for i in range(n):
            provider = "vast" if i % 2 else "runpod"
            label = f"live-{provider}-{i:06d}"
            rows[label] = Row(
                label=label, provider=provider, role="live", kind="standing", card="RTX 4090",
                gpu_count=1, usd_per_hour=0.3, status="running", provider_id=str(100000 + i),
                ssh_host=f"10.{i // 65536}.{i // 256 % 256}.{i % 256}", ssh_port=22,
                public_ip=f"100.64.{i // 256 % 256}.{i % 256}", p2p_public_port=26611,
                host_key=f"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI{i:024d}", standing=True,
                created_at="2026-12-05T00:00:00Z")
    return cfg_path


def child(cfg_path: Path, n: int, unreadable: bool) -> None:
    """One round, in this fresh process: the listings built from the registry's rows (not
    timed, read by plain sqlite3 so that fleet's own reading starts cold), then the inventory
    built twice."""
    import sqlite3

    from fleet.boxes.inventory import build
    from fleet.core.config import load
    from fleet.providers.base import Box, Unreadable

    cfg = load(cfg_path)
    boxes: dict[str, list[Any]] = {"runpod": [], "vast": []}
    with sqlite3.connect(cfg.registry.parent / "fleet.db") as db:
        docs = [json.loads(doc) for (doc,) in db.execute("SELECT doc FROM boxes")]
    for d in docs:
        boxes[d["provider"]].append(
            Unreadable(d["provider"], d["provider_id"], d["label"], "KeyError: 'HostPort'")
            if unreadable else Box(d["provider"], d["provider_id"], d["label"], d["card"], 1,
                                   0.3, "running", ssh_host=d["ssh_host"],
                                   ssh_port=d["ssh_port"]))
    providers = {name: Listing(name, listed) for name, listed in boxes.items()}
    times = {}
    for what in ("cold", "warm"):
        t = time.perf_counter()
        built = build(cfg, providers)
        times[what] = time.perf_counter() - t
        hosts = len(built.groups.get("standing", []))
        assert hosts == (0 if unreadable else n), hosts
        assert not built.orphans and not built.down, built.down[:3]
    print(json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--unreadable", action="store_true",
                    help="every listing row unreadable: every registry row unsure")
    ap.add_argument("--child", nargs=2, metavar=("CONFIG", "N"), help=argparse.SUPPRESS)
    args = _smoke.parse(ap, sizes=[100, 1000], rounds=1)
    if args.child:
        child(Path(args.child[0]), int(args.child[1]), args.unreadable)
        return
    out: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "python": platform.python_version(), "rounds": args.rounds,
                           "unreadable": args.unreadable, "sizes": []}
    for n in args.sizes:
        with tempfile.TemporaryDirectory() as tmp:
            cfg_path = fill(Path(tmp), n)
            rounds = []
            for _ in range(args.rounds):
                done = subprocess.run([sys.executable, __file__, "--child", str(cfg_path),
                                       str(n), *(["--unreadable"] if args.unreadable else [])],
                                      capture_output=True, text=True, check=True)
                rounds.append(json.loads(done.stdout))
        out["sizes"].append({"rows": n, **{k: round(statistics.median(r[k] for r in rounds), 3)
                                           for k in ("cold", "warm")}})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
