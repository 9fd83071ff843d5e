"""Every peers file of one deploy run over 1,000 and 5,000 standing boxes, in-process.

    .venv/bin/python bench/peers_files.py [--sizes 1000 5000] [--rounds 3] [--smoke]

Per size N: N standing boxes in networks of three roles (half of them in one network, the rest
in networks of ten), as the inventory's host data carries them. Timed: the text of every box's
peers file as `deploys/peers.py` and `deploys/standing.py` write it, the run's endpoints
gathered once (`deploy_support.Mesh`, what `inventory_mesh` keeps for a run), against the
same files computed per host from all hosts (`deploy_support.peers_text`, a pass over every
host for each). Both are checked to give the same files. The figure is the median round,
printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import _smoke

from fleet.boxes.deploy_support import Mesh, peers_text


def hosts(n: int) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for i in range(n):
        network = "dn1" if i < n // 2 else f"net{i // 10}"
        role = ("seed", "miner", "prover")[i % 3]
        out.append((f"{network}-{role}-{i:05d}", {
            "role": f"{network}-{role}", "network": network,
            "public_ip": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
            "p2p_public_port": 40000 + i % 20000}))
    return out


def timed(fn: Any, rounds: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    ap.add_argument("--rounds", type=int, default=3)
    a = _smoke.parse(ap, sizes=[60], rounds=1)
    sizes, rounds = a.sizes, a.rounds
    figures = []
    for n in sizes:
        hs = hosts(n)
        once_s, once = timed(lambda hs=hs: (lambda m: [m.text(h) for h, _ in hs])(Mesh(hs)),
                             rounds)
        each_s, each = timed(lambda hs=hs: [peers_text(h, hs) for h, _ in hs], rounds)
        assert once == each
        figures.append({"boxes": n, "endpoints_once_s": round(once_s, 4),
                        "per_host_s": round(each_s, 4)})
    print(json.dumps({"date": datetime.now(UTC).date().isoformat(),
                      "python": platform.python_version(), "rounds": rounds,
                      "figures": figures}))


if __name__ == "__main__":
    main()
