"""The fleet's state at scale, in-process with an in-memory provider (no SSH): one registry
update, one rent's row with the budget check, a healthy tick (with and without the CLI's page
hook) and a tick in which every box's SSH port was remapped (provider maintenance).

Each figure is measured on the code of a tree (`--tree`, default this checkout) in a child
process of its own: `--baseline REV` measures the same in a temporary `git worktree` of REV as
well, in the same run, and prints both with their ratio. The workload only uses what both the
JSON registry and the database have (`Registry.transaction/update/add`, `Loop.tick`).

    .venv/bin/python bench/state_scale.py --boxes 10000 --baseline ae7a67e
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
WANTED = "0123456789abcdef"

TOML = """
[fleet]
registry = "{tmp}/state/boxes.json"
ssh_key = "{tmp}/state/ssh/fleet"
known_hosts = "{tmp}/state/known_hosts"
releases = "{tmp}/state/releases"
daily_budget_usd = 100000000
[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node"]
admitted_driver = "580.95.05"
[[roster.live]]
provider = "vast"
card = "RTX 4090"
count = {n}
"""


def _child(n: int, what: str, rounds: int) -> dict[str, Any]:
    """Runs in the tree under test (its fleet on sys.path)."""
    import tomllib

    from fleet.core import config
    from fleet.core.boxes import Row
    from fleet.core.verdicts import Health
    from fleet.ops import budget
    from fleet.ops.loop import Loop
    from fleet.providers.base import Box
    from fleet.state.registry import Registry

    class Listing:
        name = "vast"

        def __init__(self) -> None:
            self.listed: dict[str, Box] = {}

        def offers(self, *a: Any, **k: Any) -> list[Any]:
            return []

        def boxes(self) -> list[Box]:
            return list(self.listed.values())

        def box(self, box_id: str) -> Box | None:
            return self.listed.get(box_id)

        def find_by_label(self, label: str) -> Box | None:
            return next((b for b in self.listed.values() if b.label == label), None)

    tmp = Path(tempfile.mkdtemp(prefix="fleet-state-bench-"))
    path = tmp / "fleet.toml"
    path.write_text(TOML.format(tmp=tmp, n=n))
    cfg = config.parse(tomllib.loads(path.read_text()), path)
    cfg.ssh_key.parent.mkdir(parents=True)
    cfg.ssh_key.write_text("a key the checks never use: they are given\n")
    reg = Registry(cfg.registry)
    fid = reg.fleet_id()
    vast = Listing()
    with reg.transaction() as rows:
        for i in range(n):
            label = f"live-{fid}-vast-{i:06x}"
            rows[label] = Row(label, "vast", "live", "standing", "RTX 4090", 1, 0.3,
                              status="running", provider_id=str(1000 + i),
                              ssh_host="10.0.0.1", ssh_port=20000 + i % 40000,
                              place=f"vast machine {i}",
                              host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKey",
                              standing=True, standing_since="2026-12-01T00:00:00Z",
                              node_sha16_wanted=WANTED, created_at="2026-12-01T00:00:00Z")
            vast.listed[str(1000 + i)] = Box("vast", str(1000 + i), label, "RTX 4090", 1, 0.3,
                                             "running", ssh_host="10.0.0.1",
                                             ssh_port=20000 + i % 40000, machine_id=str(i))
    labels = [r.label for r in reg.rows()]

    def well(_cfg: Any, built: Any) -> list[Health]:
        return [Health(name, "vast", ssh=True, agent=True, synced=True, blocks=12, exec_tip=11,
                       exec_moving=True, admitted=True, admission_reason="ok",
                       node_sha16=WANTED, wanted_sha16=WANTED, problems=[])
                for name, _data in built.groups.get("standing", [])]

    def loop(after: Any = None) -> Any:
        return Loop(cfg, {"vast": vast}, destroy_orphans=False, check_fn=well,
                    converge_fn=lambda _c, _l: None, after_tick=after, echo=lambda _l: None)

    times: list[float] = []
    if what == "update":
        for i in range(rounds):
            t0 = time.perf_counter()
            reg.update(labels[(i * 7919) % n], note=f"round {i}")
            times.append(time.perf_counter() - t0)
    elif what == "rent":
        for i in range(rounds):
            row = Row(f"live-{fid}-vast-x{i:05x}", "vast", "live", "standing", "RTX 4090", 1,
                      0.3)
            t0 = time.perf_counter()
            reg.add(row, check=budget.guard(cfg.daily_budget_usd, 0.3, "renting", account=[]))
            times.append(time.perf_counter() - t0)
    elif what in ("tick", "tick+page"):
        after = None
        if what == "tick+page":
            from fleet import page
            from fleet.cli.loop_cmd import page_after_tick

            after = page_after_tick(cfg, page.prepare(tmp / "page"))
        lp = loop(after)
        lp.tick()  # the first tick of a process reads what later ones keep
        for _ in range(rounds):
            t0 = time.perf_counter()
            t = lp.tick()
            times.append(time.perf_counter() - t0)
            assert len(t.well) == n and not t.dead and not t.owed, t.summary()
    elif what == "remap":
        lp = loop()
        lp.tick()
        for r in range(rounds):
            for b in vast.listed.values():
                b.ssh_port = 40000 + (int(b.box_id) + r) % 20000
            t0 = time.perf_counter()
            t = lp.tick()
            times.append(time.perf_counter() - t0)
            assert len(t.well) == n, t.summary()
        moved = {r.ssh_port for r in reg.rows()}
        assert moved == {b.ssh_port for b in vast.listed.values()}
    return {"what": what, "boxes": n, "rounds": rounds,
            "p50_s": statistics.median(times), "max_s": max(times)}


def run_in(tree: Path, n: int, what: str, rounds: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("FLEET_DATABASE_URL", None)
    out = subprocess.run([sys.executable, __file__, "--child", what, "--boxes", str(n),
                          "--rounds", str(rounds)], env=env, cwd=tree, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{what} at {n} in {tree}: {out.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


CASES = {  # what -> rounds
    "update": 50, "rent": 10, "tick": 3, "tick+page": 2, "remap": 2}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boxes", type=int, default=10_000)
    ap.add_argument("--baseline", help="a git revision to measure the same on")
    ap.add_argument("--baseline-boxes", type=int, default=None,
                    help="fewer boxes for the baseline where it would take hours")
    ap.add_argument("--only", nargs="*", default=list(CASES))
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--baseline-rounds", type=int, default=None)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--smoke", action="store_true", help="every case once at 100 boxes, as JSON")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(_child(a.boxes, a.child, a.rounds or CASES[a.child])))
        return
    if a.smoke:
        print(json.dumps({"cases": [run_in(REPO, 100, what, 1) for what in CASES]}))
        return
    base_tree = None
    if a.baseline:
        base_tree = Path(tempfile.mkdtemp(prefix="fleet-baseline-"))
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q",
                        str(base_tree), a.baseline], check=True)
    try:
        for what in a.only:
            rounds = a.rounds or CASES[what]
            now = run_in(REPO, a.boxes, what, rounds)
            line = f"{what:10} {a.boxes:6} boxes: p50 {now['p50_s'] * 1000:9.1f} ms"
            if base_tree is not None:
                bn = a.baseline_boxes or a.boxes
                before = run_in(base_tree, bn, what, a.baseline_rounds or rounds)
                line += (f" | {a.baseline} at {bn} boxes: p50 {before['p50_s'] * 1000:9.1f} ms"
                         f" | ratio {before['p50_s'] / now['p50_s']:.1f}x")
            print(line, flush=True)
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                            str(base_tree)], check=False)


if __name__ == "__main__":
    main()
