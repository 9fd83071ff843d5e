"""The fleet loop's simulation, soaked: many seeds past the CI's 500, each a schedule of faults
against the real loop on a simulated clock (tests/sim), every invariant checked after every
action.

    .venv/bin/python bench/sim_soak.py --seeds 5000 [--first 500] [--workers N]   [--smoke]

Prints one JSON document: seeds run, seeds per second (wall, all workers), the seeds that
broke an invariant with what they broke, and how often each fault kind was drawn. A failing
seed replays with `pytest tests/sim --seed N`. Exits 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "sim"))

import _smoke  # noqa: E402
from plan import draw  # noqa: E402
from run import run  # noqa: E402


def violations(seed: int) -> list[str]:
    return run(draw(seed)).violations


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=5000, help="how many seeds")
    ap.add_argument("--first", type=int, default=500,
                    help="the first seed (the CI runs 0 to 499)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = _smoke.parse(ap, seeds=8, workers=1)
    seeds = list(range(args.first, args.first + args.seeds))
    started = time.monotonic()
    if args.workers > 1:
        with ProcessPoolExecutor(args.workers) as pool:
            found = list(pool.map(violations, seeds, chunksize=8))
    else:
        found = [violations(s) for s in seeds]
    wall = time.monotonic() - started
    kinds = Counter(e.kind for s in seeds for e in draw(s).events)
    failed = {s: v for s, v in zip(seeds, found, strict=True) if v}
    print(json.dumps({
        "seeds": len(seeds), "first": args.first, "workers": args.workers,
        "wall_s": round(wall, 1), "seeds_per_s": round(len(seeds) / wall, 2),
        "failed": len(failed), "failures": {str(s): v for s, v in sorted(failed.items())},
        "fault_kinds_drawn": dict(sorted(kinds.items())),
    }, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
