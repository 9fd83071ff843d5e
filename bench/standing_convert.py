"""Standing conversion of 1, 4 and 8 sandbox boxes: first run and no-change re-run.

    .venv/bin/python bench/standing_convert.py [--sizes 1 4 8] [--smoke]   (root: sandbox boxes)

For each size: a fresh sandbox (namespaced SSH hosts), boxes rented on both fake providers
through the fleet's own CLI, then `pyinfra -y inventory.py deploys/standing.py` twice. Per run:
wall time, the operator's CPU time (the pyinfra process: user + system), and the SSH requests
each box's sshd received (its own log at LogLevel VERBOSE: every exec'd command and every sftp
subsystem start is one request; counted box-side, not by the client). Sandbox boxes share
this machine's cores, so wall time says little; on real providers each request is a round trip
of 50-200 ms, so requests per box is what an operator waits for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _smoke

from sandbox import fleet_toml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ONE_PER_PROVIDER = (("vast", "RTX 4090", 1), ("runpod", "RTX 4090", 1))


def config(state: Path) -> str:
    return fleet_toml.render(state, budget=1000, roster=ONE_PER_PROVIDER)


REQUEST_MARKS = ("Starting session: command", "subsystem request for sftp")


def requests_per_box(sandbox: Path) -> dict[str, int]:
    counts = {}
    for log in sorted(sandbox.glob("boxes/*/log/sshd.log")):
        text = log.read_text(errors="replace")
        counts[log.parent.parent.name] = sum(text.count(m) for m in REQUEST_MARKS)
    return counts


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"{argv} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stdout + r.stderr


def one_size(n: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        base = Path(tmp)
        (base / "fleet.toml").write_text(config(base / "state"))
        sandbox = base / "sandbox"
        env = {**os.environ, "FLEET_CONFIG": str(base / "fleet.toml"),
               "FLEET_SANDBOX_DIR": str(sandbox), "PYINFRA_PROGRESS": "off",
               "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
        try:
            timed([str(BIN / "fleet"), "sandbox", "up", "--boxes", str(n), "--backend", "ns"],
                  env)  # fails in the sandbox's own words
            for line in (sandbox / "env").read_text().splitlines():
                if line.startswith("export "):
                    k, _, v = line[7:].partition("=")
                    env[k] = v.strip("'")
            deploy = [str(BIN / "pyinfra"), "-y", "inventory.py", "deploys/standing.py"]
            runs = {}
            for name in ("first", "rerun"):
                seen = requests_per_box(sandbox)
                wall, cpu, out = timed(deploy, env)
                now = requests_per_box(sandbox)
                per_box = [now[b] - seen.get(b, 0) for b in now]
                total = next(ln for ln in out.splitlines() if "Grand total" in ln).split()
                runs[name] = {"wall_s": round(wall, 2), "cpu_s": round(cpu, 3),
                              "cpu_s_per_box": round(cpu / n, 3),
                              "requests_per_box_max": max(per_box),
                              "requests_per_box": per_box, "changed_ops": total[3]}
            return {"boxes": n, **runs}
        finally:
            subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                           capture_output=True, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8])
    args = _smoke.parse(ap, sizes=[1])
    results = [one_size(n) for n in args.sizes]
    print(json.dumps({"date": datetime.now(UTC).date().isoformat(),
                      "machine": f"{os.cpu_count()} cores, {platform.platform()}",
                      "results": results}, indent=1))
    print("\n| boxes | run | wall s | operator CPU s | CPU s per box | SSH requests per box |")
    print("|---|---|---|---|---|---|")
    for r in results:
        for name in ("first", "rerun"):
            x = r[name]  # type: ignore[index]
            print(f"| {r['boxes']} | {name} | {x['wall_s']} | {x['cpu_s']} | "
                  f"{x['cpu_s_per_box']} | {x['requests_per_box_max']} |")


if __name__ == "__main__":
    main()
