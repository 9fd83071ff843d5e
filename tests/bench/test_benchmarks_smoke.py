"""Every benchmark in bench/ still runs: each with `--smoke` (its smallest sizes), end to end.

A benchmark nothing runs rots unseen (bench/oneshot.py did when the one-shot guards landed).
The figures of a smoke run are never compared with a target: the machine is shared and the
sizes are tiny. What is checked is that the benchmark's steps still pass the product's guards,
that it measured (its figures are numbers, not blanks) and that what it promises of the product
held (a re-run changes nothing, a warm job fetches nothing). A file added to bench/ without an
entry here fails `test_every_benchmark_has_a_smoke_run`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
LIMIT_S = 900  # a smoke run takes about a minute (the loop's up to three): this stops a hung one


def first_json(out: str) -> Any:
    """The JSON document a benchmark prints first on stdout (a table may follow)."""
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]


def last_json_line(out: str) -> Any:
    return json.loads(out.strip().splitlines()[-1])


def numbers(*values: Any) -> bool:
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def oneshot(out: str) -> None:
    d = first_json(out)
    cold, warm = d["toolchain"]
    assert cold["bytes_fetched"] > 0 and warm["bytes_fetched"] == 0 and warm["warm"], d
    assert d["teardown"]["bytes"] > 0 and numbers(d["teardown"]["ratio_to_floor"]), d


def publish(out: str) -> None:
    r = first_json(out)["results"][0]
    downtimes = [*r["switch_downtime_s"].values(), *r["restart_downtime_s"].values()]
    assert downtimes and numbers(*downtimes), r  # None: a sampler saw no synced answer


def standing_convert(out: str) -> None:
    r = first_json(out)["results"][0]
    assert numbers(r["first"]["cpu_s_per_box"], r["rerun"]["cpu_s_per_box"]), r
    # the second run changes nothing: pyinfra's grand total says "-" (or 0) changed
    assert str(r["rerun"]["changed_ops"]) in ("-", "0"), r


def check_cpu(out: str) -> None:
    d = first_json(out)
    assert numbers(d["fresh"]["total_ms_per_box_check"], d["reused"]["total_ms_per_box_check"],
                   d["ratio"]), d


def loop(out: str) -> None:
    d = first_json(out)
    assert numbers(d["replacement"]["death_to_replaced_and_checked_s"]), d
    assert numbers(d["healthy"][0]["ssh_requests_per_box_max"]), d


def mesh_replace(out: str) -> None:
    r = first_json(out)["rounds"][0]
    assert numbers(r["peers_files_s"], r["two_inbound_s"]), r


def amd_admission(out: str) -> None:
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    checks, result = lines[:-1], lines[-1]
    assert [c["vendor"] for c in checks] == ["nvidia", "amd"], out
    assert all(c["checks"] == 5 and c["refused"] == [] and numbers(c["median_ms"])
               for c in checks), out
    assert result["ok"] is True and numbers(result["ratio_amd_to_nvidia"]), out


def nvml_device(out: str) -> None:
    assert last_json_line(out) == {"what": "result", "ok": True, "failures": []}, out


def demo_repeat(out: str) -> None:
    d = last_json_line(out)
    assert d["passed"] == d["runs"] == 1, d


def inventory_1000(out: str) -> None:
    hosts = re.search(r"full inventory .* median: [\d.]+ s for (\d+) hosts", out)
    assert "boxes: 60 " in out and hosts and int(hosts[1]) > 0, out


def boxes_ready(out: str) -> None:
    assert re.search(r"^\| 2 \| \d+ ms \| \d+ ms \| \d+ ms \| \d+ ms \| \d+ ms \|$", out, re.M), out


def agent_vs_supervisord(out: str) -> None:
    for supervisor in ("agent", "supervisord"):
        assert re.search(rf"^\| {supervisor} \| 3 \| [\d.]+ ms \|", out, re.M), out


def job_domain(out: str) -> None:
    d = first_json(out)
    assert d["kill_marked"]["killed"] == 0 and d["kill_descendants"]["killed"] == [2, 2], d
    assert d["others_alive_after"] == d["others"] == 20, d
    assert numbers(d["kill_marked"]["median_ms"], d["kill_descendants"]["median_ms"]), d


def sim_soak(out: str) -> None:
    d = first_json(out)
    assert d["seeds"] == 8 and d["failed"] == 0 and numbers(d["seeds_per_s"]), d


def storage_clean(out: str) -> None:
    d = first_json(out)
    assert d["freed_files"] == d["files"] == 2000 and d["kept_releases_survive"], d
    assert numbers(d["review_s"], d["clean_s"]), d


def postgres_test_server(out: str) -> None:
    for r in first_json(out)["results"]:
        assert r["databases_per_round"] == 3, r
        assert numbers(*(r[f]["median_ms"] for f in ("start", "stop_and_remove",
                                                       "create_and_drop"))), r


def state_scale(out: str) -> None:
    cases = first_json(out)["cases"]
    assert sorted(c["what"] for c in cases) == sorted(
        ["update", "rent", "tick", "tick+page", "remap"]), cases
    assert all(c["boxes"] == 100 and numbers(c["p50_s"], c["max_s"]) for c in cases), cases


def check_scale(out: str) -> None:
    sizes = first_json(out)["sizes"]
    assert [s["boxes"] for s in sizes] == [100, 1000], sizes
    assert all(numbers(s["judge_s"]) for s in sizes), sizes


def peers_files(out: str) -> None:
    figures = first_json(out)["figures"]
    assert [f["boxes"] for f in figures] == [60], figures
    assert all(numbers(f["endpoints_once_s"], f["per_host_s"]) for f in figures), figures


def inventory_scale(out: str) -> None:
    sizes = first_json(out)["sizes"]
    assert [s["rows"] for s in sizes] == [100, 1000], sizes
    assert all(numbers(s["cold"], s["warm"]) for s in sizes), sizes


def page_scale(out: str) -> None:
    sizes = first_json(out)["sizes"]
    assert [s["live_boxes"] for s in sizes] == [100, 1000], sizes
    assert all(numbers(s["build_s"], s["render_s"]) for s in sizes), sizes


def leader_failover(out: str) -> None:
    d = first_json(out)
    assert d["kills"] == 3 and d["creates"] >= 1, d
    assert (d["labels_created_twice"], d["creates_without_a_row"],
            d["boxes_listed_without_a_row_at_end"], d["most_live_boxes_per_slot"]) == \
        (0, 0, 0, 1), d
    assert numbers(d["takeover_s"]["p50"], d["takeover_s"]["max"]), d


MEASURED: dict[str, Callable[[str], None]] = {
    f"{check.__name__}.py": check for check in (
        agent_vs_supervisord, amd_admission, boxes_ready, check_cpu, check_scale, demo_repeat,
        inventory_1000, inventory_scale, job_domain, leader_failover, loop, mesh_replace,
        nvml_device, oneshot, page_scale, peers_files, postgres_test_server, publish, sim_soak,
        standing_convert, state_scale, storage_clean)
}


def benchmarks() -> list[str]:
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def test_every_benchmark_has_a_smoke_run() -> None:
    assert benchmarks() == sorted(MEASURED)


def bench_out() -> dict[str, int] | None:
    """Every entry under bench/out/ (where full runs keep figures) with its mtime; None: none."""
    out = BENCH / "out"
    if not out.exists():
        return None
    return {str(p.relative_to(out)): p.lstat().st_mtime_ns for p in out.rglob("*")}


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_the_benchmark_runs_at_its_smallest_sizes(name: str) -> None:
    before = bench_out()
    proc = subprocess.Popen([sys.executable, str(BENCH / name), "--smoke"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # a hung one is stopped with its children
    try:
        stdout, stderr = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)  # its own `finally` takes its sandbox down
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"{name} --smoke still ran after {LIMIT_S} s:\n{stdout[-3000:]}\n"
                    f"{stderr[-3000:]}")
    said = f"{stdout[-4000:]}\n--- stderr ---\n{stderr[-4000:]}"
    assert proc.returncode == 0, f"{name} --smoke exited {proc.returncode}:\n{said}"
    try:
        MEASURED[name](stdout)
    except (AssertionError, LookupError, ValueError, TypeError) as e:
        pytest.fail(f"{name} --smoke did not measure what it promises ({e!r}):\n{said}")
    assert bench_out() == before, "a smoke run wrote into bench/out"
