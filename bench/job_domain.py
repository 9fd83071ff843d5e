"""What a one-shot job's kill domain costs (agent/job/domain.py), on this machine:

    python3 bench/job_domain.py [--others 1000] [--left 10] [--rounds 7]

- the mark's sweep (`kill_marked`): one pass over /proc reading every process's environment,
  done when a step starts, on a refusal, a close and an interrupted run; timed with `--others`
  unrelated processes alive beside the machine's own, none of them marked (nothing killed);
- the subreaper's sweep (`kill_descendants`): after a gate that left `--left` daemons, each in
  a session of its own (`setsid sleep`), the time to find, kill and reap them all (the
  `--others`, this process's own children here, are spared by pid).

It prints one JSON document: medians and worst rounds in milliseconds, the process count, and
how many were killed (which must be every daemon, and none of the others).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _smoke  # noqa: E402

from agent.job import domain  # noqa: E402


def sweep_marked(rounds: int) -> tuple[list[float], int]:
    times, killed = [], 0
    for _ in range(rounds):
        began = time.perf_counter()
        killed += domain.kill_marked(domain.new_mark())
        times.append((time.perf_counter() - began) * 1000)
    return times, killed


def sweep_descendants(left: int, rounds: int, keep: set[int]) -> tuple[list[float], list[int]]:
    times, counts = [], []
    for _ in range(rounds):
        # the gate's shell leaves `left` daemons in sessions of their own, then exits
        subprocess.run(["/bin/sh", "-c", f"for i in $(seq {left}); do setsid sleep 600 "
                        "</dev/null >/dev/null 2>&1 & done"], check=True)
        began = time.perf_counter()
        counts.append(domain.kill_descendants(keep))
        times.append((time.perf_counter() - began) * 1000)
    return times, counts


def summary(times: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(times), 2), "worst_ms": round(max(times), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--others", type=int, default=1000)
    ap.add_argument("--left", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=7)
    args = _smoke.parse(ap, others=20, left=2, rounds=2)
    domain.enter()
    others = [subprocess.Popen(["sleep", "600"], start_new_session=True)
              for _ in range(args.others)]
    try:
        processes = sum(1 for e in os.listdir("/proc") if e.isdigit())
        marked, wrongly = sweep_marked(args.rounds)
        subtree, counts = sweep_descendants(args.left, args.rounds, {p.pid for p in others})
        alive = sum(1 for p in others if p.poll() is None)
    finally:
        for p in others:
            p.kill()
        for p in others:
            p.wait()
    print(json.dumps({
        "processes": processes, "rounds": args.rounds,
        "kill_marked": {**summary(marked), "killed": wrongly},
        "kill_descendants": {**summary(subtree), "left": args.left, "killed": counts},
        "others_alive_after": alive, "others": args.others}, indent=1))
    ok = wrongly == 0 and counts == [args.left] * args.rounds and alive == args.others
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
