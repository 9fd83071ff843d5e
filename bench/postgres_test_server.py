"""What the tests' PostgreSQL server (tests/pgserver.py) costs: a session's server, initdb to
taking connections and stopped with its folders removed, and a test's fresh database, created
and dropped as `pg_url` does; with fsync on (as the tests run it) and off (to see whether
durability is what costs). Run as root, from the repository root:

    .venv/bin/python bench/postgres_test_server.py --rounds 5 --databases 20

It prints one JSON document: per fsync setting, the median and worst of each figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import _smoke  # noqa: E402
import pgserver  # noqa: E402


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    got = step()
    return time.perf_counter() - t, got


def figures(seconds: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(seconds) * 1000, 1),
            "worst_ms": round(max(seconds) * 1000, 1)}


def measure(rounds: int, databases: int, fsync: str) -> dict[str, Any]:
    start, stop, create, drop = [], [], [], []
    for _ in range(rounds):
        t = time.perf_counter()
        with pgserver.running(fsync=fsync) as server:
            start.append(time.perf_counter() - t)
            for _ in range(databases):
                took, name = timed(partial(pgserver.create_database, server))
                create.append(took)
                drop.append(timed(partial(pgserver.drop_database, server, name))[0])
            t = time.perf_counter()
        stop.append(time.perf_counter() - t)
    return {"fsync": fsync, "rounds": rounds, "databases_per_round": databases,
            "start": figures(start), "stop_and_remove": figures(stop),
            "create_database": figures(create), "drop_database": figures(drop),
            "create_and_drop": figures([c + d for c, d in zip(create, drop, strict=True)])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="servers started, per fsync setting")
    ap.add_argument("--databases", type=int, default=20, help="databases per server")
    args = _smoke.parse(ap, rounds=1, databases=3)
    results = [measure(args.rounds, args.databases, fsync) for fsync in ("on", "off")]
    print(json.dumps({"results": results}, indent=2))


if __name__ == "__main__":
    main()
