"""The README's demo: a local cloud, boxes rented on both fake providers and converted by the
real standing deploy, verified by testinfra and `fleet check`, and the roster printed; then a
one-shot job run end to end, and a box kept because a copy of its outputs did not match.

    ./run.sh demo            # or: python -m fleet.demo [--boxes N]

It leaves the sandbox running so you can look around; `fleet sandbox down` ends it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.rule import Rule

from fleet.cli import sandbox_setup
from fleet.core.config import load
from fleet.core.errors import FleetError
from fleet.core.paths import REPO
from fleet.core.states import BoxKind
from fleet.state.registry import Registry

console = Console()


def step(title: str) -> None:
    console.print(Rule(f"[bold]{title}"))


def run(argv: list[str], env: dict[str, str]) -> int:
    console.print(f"[dim]$ {' '.join(argv)}[/dim]")
    return subprocess.run(argv, cwd=REPO, env=env).returncode


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fleet.demo")
    ap.add_argument("--boxes", type=int, default=4, help="boxes to rent (default 4)")
    args = ap.parse_args()
    os.chdir(REPO)
    cfg = load(REPO / "fleet.toml")
    sandbox_dir = REPO / ".sandbox"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
           "PYINFRA_PROGRESS": "off", "COLUMNS": os.environ.get("COLUMNS", "150")}

    step("1. the sandbox: fake RunPod and Vast APIs, boxes as real SSH hosts")
    live = [r for r in Registry(cfg.registry).live_rows() if r.kind == BoxKind.STANDING]
    want = 0 if sandbox_setup.status(sandbox_dir).get("running") and live else args.boxes
    sandbox_setup.up(cfg, sandbox_dir, boxes=want, role=None, backend="auto", seed=7,
                   console=console)
    env.update(sandbox_setup.load_env(sandbox_dir))

    step("2. convert them: pyinfra inventory.py deploys/standing.py")
    if run(["pyinfra", "-y", "inventory.py", "deploys/standing.py"], env) != 0:
        return 1
    step("   ... and again: the second run changes nothing")
    if run(["pyinfra", "-y", "inventory.py", "deploys/standing.py"], env) != 0:
        return 1

    step("3. verify: the testinfra checks in tests/infra")
    if run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/infra"],
           env) != 0:
        return 1

    step("4. fleet check")
    # a box just converted may still be syncing: look again until all are well (bounded)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        r = subprocess.run(["fleet", "check", "--json"], cwd=REPO, env=env, capture_output=True)
        if r.returncode == 0:
            break
        time.sleep(5)
    rc = run(["fleet", "check"], env)

    step("5. one tick of the fleet loop: every standing box checked, the page written")
    if run(["fleet", "loop", "--once"], env) != 0:
        return 1
    page = cfg.registry.parent / "page" / "index.html"
    console.print(f"the fleet page: {page} (open it in a browser; fleet.json beside it)")

    step("6. the roster: each node's p2p peers in/out, as the loop's tick read them")
    run(["fleet", "roster"], env)

    if oneshot(env) != 0:
        return 1

    step("where to look next")
    console.print(
        "  set -a; . .sandbox/env; set +a          # point your shell at the sandbox\n"
        "  fleet roster | fleet check | fleet offers live\n"
        "  fleet loop --interval 10                 # keep the fleet up; Ctrl-C to stop\n"
        "  pyinfra inventory.py debug-inventory\n"
        "  fleet sandbox fault host_death <label>   # or driver_drift, container_restart, ...\n"
        "  fleet sandbox down                       # destroy the boxes, stop the sandbox\n"
        "  docs/ for the design, bench/RESULTS.md for the figures")
    return 0 if rc == 0 else 1


def oneshot(env: dict[str, str]) -> int:
    """A one-shot job end to end, then a copy that does not match keeping its box."""
    job = "examples/bench/job.toml"
    step("7. a one-shot job: its toolchain into the store, then fleet run")
    if run(["fleet", "store", "push", "examples/bench/toolchain", "--repo",
            "fleet/toolchains"], env) != 0:
        return 1
    if run(["fleet", "run", "bench", job], env) != 0:
        return 1

    step("8. a copy that does not match keeps the box: the store returns wrong bytes")
    console.print(f"[dim]$ fleet run bench {job} --keep --json[/dim]")
    kept = subprocess.run(["fleet", "run", "bench", job, "--keep", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if kept.returncode != 0:
        console.print(kept.stderr, markup=False)
        return 1
    label = json.loads(kept.stdout)["label"]
    run(["fleet", "sandbox", "fault", "store_wrong_bytes"], env)
    if run(["fleet", "teardown", label], env) == 0:
        console.print("error: a store answering wrong bytes did not keep the box")
        return 1
    run(["fleet", "check"], env)  # flags the kept box (and says why) on every check
    step("   ... the store answers true again: read back, then destroyed")
    return run(["fleet", "teardown", label], env)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except FleetError as e:
        console.print(f"error: {e}", markup=False)
        sys.exit(e.exit_code)
