"""`fleet loop`: detection to replacement of a dead standing box, and one tick over 8 and 32
healthy boxes.

    .venv/bin/python bench/loop.py [--sizes 8 32] [--interval 10] [--ticks 3] [--smoke]
                                                                    (root: sandbox boxes)

1. Replacement: a fresh sandbox, a roster of one standing box per provider (RTX 4090),
   converted by one tick; then `fleet loop --interval 10 --json` runs while the Vast box's
   host dies. Figures: from the host's death to the end of the tick that replaced it (its
   new box converted by the standing deploy and verified by the testinfra checks), how much
   of that was the conversion, and the target: two intervals plus that one conversion.
2. Healthy ticks: a fresh sandbox (four machines per wanted box in each provider's
   market) whose roster wants N RTX 4090 boxes (half per provider), filled and
   converted by the loop (a box RunPod placed on another driver is unfit and replaced),
   then settled; then `fleet loop --once` three times (--ticks). Per tick: the loop
   process's CPU (user + system, with the programs it starts and waits for: it starts Python
   and imports pyinfra each time, and reads each box through the system's `ssh`), split into
   the loop process's own and its children's (the `ssh` clients), and the SSH requests each
   box's sshd logged (LogLevel VERBOSE: each exec'd command or sftp start is one).
   Target: at most one SSH command per healthy box per tick.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _smoke

from fleet.state.registry import Registry
from sandbox import fleet_toml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO / "bench"))
from standing_convert import requests_per_box  # noqa: E402

# per provider, a market of four machines per wanted box (each holding one to eight GPUs,
# a third of them on another driver or without a direct port): enough RTX 4090s for all
CARD = "RTX 4090"
# `fleet loop --once` run as the console script runs it, saying at its end on stderr how its
# CPU splits: its own (every thread) and its children's (the programs it started and waited for)
SPLIT = '''
import json, resource, runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print("bench-cpu " + json.dumps({"own_s": own.ru_utime + own.ru_stime,
                                      "children_s": kids.ru_utime + kids.ru_stime}),
          file=sys.stderr, flush=True)
'''


def roster(boxes: int) -> list[tuple[str, str, int]]:
    return [(p, CARD, max(1, boxes // 2)) for p in ("vast", "runpod")]


class Sandbox:
    def __init__(self, base: Path, boxes: int, interval: float) -> None:
        self.base = base
        (base / "fleet.toml").write_text(fleet_toml.render(
            base / "state", budget=5000, roster=roster(boxes),
            # the orphan grace must be at least two intervals (600 s is the default)
            loop={"interval_s": interval, "orphan_grace_s": max(600.0, 2 * interval)}))
        self.machines = max(16, 4 * boxes)
        self.env = {**os.environ, "FLEET_CONFIG": str(base / "fleet.toml"),
                    "FLEET_SANDBOX_DIR": str(base / "sandbox"), "PYINFRA_PROGRESS": "off",
                    "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}

    def __enter__(self) -> Sandbox:
        from sandbox import manage

        self.fleet("sandbox", "up", "--boxes", "0", "--backend", "ns",
                   "--machines", str(self.machines))
        self.env.update(manage.load_env(self.base / "sandbox"))
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=self.env,
                       capture_output=True, timeout=900)

    def fleet(self, *args: str) -> str:
        r = subprocess.run([str(BIN / "fleet"), *args], cwd=REPO, env=self.env,
                           capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise SystemExit(f"fleet {' '.join(args)} failed:\n{r.stdout[-3000:]}\n"
                             f"{r.stderr[-3000:]}")
        return r.stdout

    def loop(self, log: Path, *args: str) -> subprocess.Popen[bytes]:
        """`fleet loop --json` running: its ticks in `log`, its stderr beside it."""
        with log.open("w") as out, log.with_suffix(".err").open("w") as err:
            return subprocess.Popen([str(BIN / "fleet"), "loop", *args, "--json"], cwd=REPO,
                                    env=self.env, stdout=out, stderr=err)

    @staticmethod
    def alive(loop: subprocess.Popen[bytes], log: Path) -> None:
        """Stop the benchmark at once, in the loop's own words, if the loop has exited."""
        if loop.poll() is not None:
            words = log.with_suffix(".err").read_text(errors="replace")[-3000:]
            raise SystemExit(f"fleet loop exited ({loop.returncode}) mid-benchmark:\n{words}")

    def tick(self) -> dict[str, Any]:
        out = self.fleet("loop", "--once", "--json")
        return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])

    def measured_tick(self) -> tuple[dict[str, Any], dict[str, float]]:
        """One `fleet loop --once`, and how its CPU split (SPLIT)."""
        r = subprocess.run([sys.executable, "-c", SPLIT, str(BIN / "fleet"), "loop", "--once",
                            "--json"], cwd=REPO, env=self.env, capture_output=True, text=True,
                           timeout=3600)
        if r.returncode != 0:
            raise SystemExit(f"fleet loop --once failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        split = [ln for ln in r.stderr.splitlines() if ln.startswith("bench-cpu ")][-1]
        return (json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("{")][-1]),
                json.loads(split.removeprefix("bench-cpu ")))

    def settle(self, boxes: int, ticks: int = 30) -> None:
        """Tick until every wanted box is well; a market that cannot fill the roster ends
        the run with the loop's own reasons rather than ticking on."""
        t: dict[str, Any] = {}
        for _ in range(ticks):
            t = self.tick()
            if len(t["well"]) == boxes and not t["owed"] and not t["problems"]:
                return
        raise SystemExit(f"the fleet of {boxes} did not settle in {ticks} ticks: "
                         f"owed {t.get('owed')}, problems {t.get('problems')}")


def replacement(interval: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, \
            Sandbox(Path(tmp), 2, interval) as sb:
        sb.settle(2)
        rows = Registry(Path(tmp) / "state" / "boxes.json").rows()
        victim = next(r.label for r in rows if r.provider == "vast" and r.standing)
        log = Path(tmp) / "loop.jsonl"
        loop = sb.loop(log)
        try:
            time.sleep(interval / 2)  # the death lands mid-interval
            died = time.time()
            sb.fleet("sandbox", "fault", "host_death", victim)
            deadline = time.monotonic() + 1800
            done = None
            while done is None and time.monotonic() < deadline:
                sb.alive(loop, log)
                ticks = [json.loads(ln) for ln in log.read_text().splitlines()
                         if ln.startswith("{")]
                done = next((t for t in ticks if victim in t["replaced"]), None)
                time.sleep(0.5)
        finally:
            loop.send_signal(signal.SIGTERM)
            loop.wait(timeout=120)
        if done is None:
            raise SystemExit("no replacement within 30 minutes")
        ended = _epoch(done["started_at"]) + done["took_s"]
        total = ended - died
        return {"interval_s": interval, "victim": victim, "replacement": done["replaced"][victim],
                "death_to_replaced_and_checked_s": round(total, 1),
                "conversion_s": done["converge_s"],
                "detection_and_rent_s": round(total - done["converge_s"], 1),
                "target_s": round(2 * interval + done["converge_s"], 1),
                "meets_target": total <= 2 * interval + done["converge_s"]}


def healthy_ticks(boxes: int, rounds: int = 3) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp, \
            Sandbox(Path(tmp), boxes, 60) as sb:
        t0 = time.perf_counter()
        sb.settle(boxes)
        filled = time.perf_counter() - t0
        runs = []
        for _ in range(rounds):
            seen = requests_per_box(Path(tmp) / "sandbox")
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            w0 = time.perf_counter()
            t, split = sb.measured_tick()
            wall = time.perf_counter() - w0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            now = requests_per_box(Path(tmp) / "sandbox")
            per_box = [now[b] - seen.get(b, 0) for b in now]
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            assert len(t["well"]) == boxes and not t["actions"], t
            runs.append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 3),
                         "cpu_s_loop_own": round(split["own_s"], 3),
                         "cpu_s_ssh_clients": round(split["children_s"], 3),
                         "tick_s": t["took_s"], "ssh_requests_max": max(per_box),
                         "ssh_requests_total": sum(per_box)})
        best = min(runs, key=lambda r: r["cpu_s"])
        return {"boxes": boxes, "fill_and_convert_s": round(filled, 1), "runs": runs,
                "cpu_s_best": best["cpu_s"],
                "cpu_s_per_box_best": round(best["cpu_s"] / boxes, 4),
                "cpu_s_loop_own_best": best["cpu_s_loop_own"],
                "cpu_s_ssh_clients_best": best["cpu_s_ssh_clients"],
                "ssh_requests_per_tick_max": max(r["ssh_requests_total"] for r in runs),
                "ssh_requests_per_box_max": max(r["ssh_requests_max"] for r in runs)}


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--ticks", type=int, default=3, help="healthy ticks measured per size")
    ap.add_argument("--skip-replacement", action="store_true")
    # two boxes: the roster's smallest (one per provider)
    args = _smoke.parse(ap, sizes=[2], interval=5.0, ticks=1)
    if os.geteuid() != 0:
        raise SystemExit("sandbox boxes need root (namespaces)")
    out: dict[str, Any] = {"date": datetime.now(UTC).date().isoformat(),
                           "machine": f"{os.cpu_count()} cores, {platform.platform()}"}
    if not args.skip_replacement:
        out["replacement"] = replacement(args.interval)
        print(json.dumps(out["replacement"]), file=sys.stderr, flush=True)
    out["healthy"] = []
    for n in args.sizes:
        out["healthy"].append(healthy_ticks(n, args.ticks))
        print(json.dumps(out["healthy"][-1]), file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
