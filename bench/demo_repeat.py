"""The README's demo, again and again: every run from a clean start, some with the cores busy.

    .venv/bin/python bench/demo_repeat.py --runs 20 --busy 10   [--smoke: one run]

Each run starts as a fresh clone would (no sandbox up, no state/), runs `./run.sh demo`, then
takes the sandbox down. The checkout's own state/ (the registry, key and archive fleet.toml
names) is moved aside for the runs and put back after, whatever happens: never deleted.
A run passes when the demo exits 0, `fleet sandbox down` leaves no
mount or loop device of its boxes, and this machine's `/`, `/opt` and `/usr/local` are as they
were before it (`sandbox.boxes.host.host_snapshot`). The last `--busy` runs have every core kept
busy by another process. Prints one JSON line per run and a summary; a failed run keeps its log.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import _smoke  # noqa: E402

from sandbox.boxes.disks import loops_under, mounts_under  # noqa: E402
from sandbox.boxes.host import host_snapshot, snapshot_changes  # noqa: E402


def spin() -> None:
    while True:
        pass


def clean() -> None:
    subprocess.run([str(REPO / ".venv" / "bin" / "fleet"), "sandbox", "down"], cwd=REPO,
                   capture_output=True, timeout=600)
    shutil.rmtree(REPO / "state", ignore_errors=True)


@contextlib.contextmanager
def state_kept_aside() -> Iterator[None]:
    state, aside = REPO / "state", REPO / "state.kept-by-demo-repeat"
    if aside.exists():
        raise SystemExit(f"{aside} holds state an earlier run kept aside: move it back to "
                         f"{state} first")
    had = state.exists()
    if had:
        state.rename(aside)
    try:
        yield
    finally:
        clean()
        if had:
            aside.rename(state)


def one_run(n: int, busy: bool, logs: Path) -> dict[str, object]:
    clean()
    before = host_snapshot()
    hogs = [multiprocessing.Process(target=spin, daemon=True)
            for _ in range(os.cpu_count() or 1)] if busy else []
    for h in hogs:
        h.start()
    t0 = time.monotonic()
    try:
        r = subprocess.run(["./run.sh", "demo"], cwd=REPO, capture_output=True, text=True,
                           timeout=1800)
    finally:
        for h in hogs:
            h.kill()
    wall = time.monotonic() - t0
    clean()
    boxes = REPO / ".sandbox" / "boxes"
    left = mounts_under(boxes) + loops_under(boxes)
    changed = snapshot_changes(before, host_snapshot())
    ok = r.returncode == 0 and not left and not changed
    if not ok:
        (logs / f"demo-{n}.log").write_text(r.stdout + r.stderr)
    return {"run": n, "busy": busy, "rc": r.returncode, "wall_s": round(wall, 1),
            "left_behind": left, "host_changed": changed, "ok": ok}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--busy", type=int, default=10, help="of the runs, the last N with busy cores")
    ap.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = _smoke.parse(ap, runs=1, busy=0)
    results = []
    with state_kept_aside():
        for n in range(1, args.runs + 1):
            res = one_run(n, n > args.runs - args.busy, args.logs)
            print(json.dumps(res), flush=True)
            results.append(res)
    passed = sum(1 for r in results if r["ok"])
    walls = {b: [r["wall_s"] for r in results if r["busy"] is b] for b in (False, True)}
    print(json.dumps({"passed": passed, "runs": len(results),
                      "wall_s_idle": walls[False], "wall_s_busy": walls[True]}))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
