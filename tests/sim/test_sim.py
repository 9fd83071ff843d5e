"""The fleet loop under generated faults: every seed's schedule keeps every invariant
(`run.py` lists them). A failure names its seed and the shortest schedule that still fails;
`pytest tests/sim --seed N` replays it."""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor

from plan import draw
from run import run, shorten

REPORTED = 3  # failing seeds shortened and printed in full; the others are named


def violations(seed: int) -> list[str]:
    return run(draw(seed)).violations


def test_every_invariant_holds_under_every_seeds_schedule(seeds: list[int]) -> None:
    workers = min(len(seeds), os.cpu_count() or 1)
    if workers > 1:  # each seed is its own world, clock and files: they run side by side
        with ProcessPoolExecutor(workers) as pool:
            found = dict(zip(seeds, pool.map(violations, seeds, chunksize=8), strict=True))
    else:
        found = {s: violations(s) for s in seeds}
    failed = [s for s in seeds if found[s]]
    reports = [run(shorten(draw(s), lambda p: not run(p).ok)).report() for s in failed[:REPORTED]]
    assert not failed, (f"{len(failed)} of {len(seeds)} seeds broke an invariant: {failed}\n\n"
                        + "\n\n".join(reports))
