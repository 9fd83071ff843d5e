"""Every benchmark in bench/ still runs: each with `--smoke` (its smallest sizes), end to end.

A benchmark nothing runs rots unseen (bench/oneshot.py did when the one-shot guards landed).
The figures of a smoke run mean nothing and are never compared: this proves only that the
benchmark's steps still pass the product's guards and it prints what it measures. A file added
to bench/ without an entry here fails `test_every_benchmark_has_a_smoke_run`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
# what each benchmark prints once it has measured: its own figures' words
PRINTS = {
    "agent_vs_supervisord.py": "agent vs supervisord: restart median",
    "boxes_ready.py": "| boxes | start() returned (sshd listens)",
    "demo_repeat.py": '"passed": 1',
    "inventory_1000.py": "full inventory",
    "loop.py": '"ssh_requests_per_box_max"',
    "mesh_replace.py": '"two_inbound_s"',
    "nvml_device.py": '"ok": true',
    "oneshot.py": '"ratio_to_floor"',
    "publish.py": '"restart_downtime_s"',
    "standing_convert.py": '"cpu_s_per_box"',
}
LIMIT_S = 900  # a smoke run takes about a minute; this only stops a hung one


def benchmarks() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_benchmark_has_a_smoke_run() -> None:
    assert benchmarks() == sorted(PRINTS)


@pytest.mark.parametrize("name", sorted(PRINTS))
def test_the_benchmark_runs_at_its_smallest_sizes(name: str) -> None:
    out_dir = BENCH / "out"
    kept = {p: p.stat().st_mtime_ns for p in out_dir.glob("*")} if out_dir.exists() else {}
    try:
        done = subprocess.run([sys.executable, str(BENCH / name), "--smoke"], cwd=REPO,
                              capture_output=True, text=True, timeout=LIMIT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{name} --smoke still ran after {LIMIT_S} s: {str(e.stdout)[-3000:]}")
    said = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} --smoke exited {done.returncode}:\n{said[-6000:]}"
    assert PRINTS[name] in done.stdout, f"{name} printed no figures:\n{said[-6000:]}"
    now = {p: p.stat().st_mtime_ns for p in out_dir.glob("*")} if out_dir.exists() else {}
    assert {p: t for p, t in now.items() if p in kept} == kept, "a smoke run rewrote bench/out"
