"""The check's owed-port rule over a mesh of 1,000 and 10,000 standing boxes, in-process.

    .venv/bin/python bench/check_scale.py [--sizes 1000 10000] [--rounds 3] [--smoke]

Per size N: N standing boxes of one p2p role as `fleet check` reads them (each answered,
dialled by three mates and dialling three, standing for a day), two of them dialled by none.
Timed: `fleet.ops.ports.judge`, which every check (every loop tick) runs over the boxes it
read, to set each one's `port_owed`; the two lonely boxes are checked to be owed a port and
no other. The figure is the median round, printed as JSON.

To compare with the code before a change, run the same command in a checkout of that commit.
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

from fleet.core.verdicts import Health
from fleet.ops import ports

INTERVAL_S = 60.0


def mesh(n: int) -> tuple[list[tuple[str, dict[str, Any]]], list[Health]]:
    hosts: list[tuple[str, dict[str, Any]]] = []
    checks = []
    for i in range(n):
        name = f"live-vast-{i:05d}"
        hosts.append((name, {"role": "live", "provider": "vast", "p2p_port": 26611,
                             "public_ip": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                             "p2p_public_port": 40000 + i % 20000,
                             "standing_since": "2026-01-01T00:00:00Z"}))
        lonely = i < 2
        checks.append(Health(name, "vast", ssh=True, agent=True, peers_in=0 if lonely else 3,
                             peers_out=0 if lonely else 3, star_only=lonely))
    return hosts, checks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--rounds", type=int, default=3)
    args = _smoke.parse(ap, sizes=[100, 1000], rounds=1)
    out: dict[str, Any] = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
                           "python": platform.python_version(), "rounds": args.rounds,
                           "sizes": []}
    for n in args.sizes:
        times = []
        for _ in range(args.rounds):
            hosts, checks = mesh(n)
            t = time.perf_counter()
            ports.judge(hosts, checks, INTERVAL_S)
            times.append(time.perf_counter() - t)
            owed = [h.label for h in checks if h.port_owed]
            assert owed == [h.label for h in checks[:2]], owed[:5]
        out["sizes"].append({"boxes": n, "judge_s": round(statistics.median(times), 3)})
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
