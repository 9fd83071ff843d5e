"""The operator's CPU per healthy box per check: a fresh SSH connection per read (before) against
the box's reused master connection (`fleet.boxes.sshmux`), in the same run.

    .venv/bin/python bench/check_cpu.py [--boxes 32] [--rounds 5] [--smoke]   (root: sandbox boxes)

A fresh sandbox (namespaced SSH hosts) with N boxes rented and pinned, then `fleet check`'s own
work (`fleet.ops.check.check` over the inventory the loop builds) run `--rounds` times each way:
- fresh: the host data without the pinned key's name, so every read starts its own `ssh`
  connection with a full key exchange and login, as every read did before;
- reused: the inventory as the fleet builds it: one warm-up check makes each box's master, then
  the measured checks run their reads over it, as the fleet's own mux requests (`muxclient`);
- reused_by_ssh_client: the same, each read by one system `ssh` client over the master (the
  mux requests refused here, so each read takes its fallback).
Figures: CPU seconds (user + system) of this process and of the children it waited for
(`os.times()`: the `ssh` clients), plus, for the reused way, the masters' own CPU over the same
rounds (they run detached, so no rusage of this process counts them: their /proc schedstat), divided
by boxes x rounds; and the CPU of starting one `ssh` client that does nothing (`ssh -V`), the
floor of any read that starts one. The boxes are rented, not converted: the status read
answers "no agent", so the figures are the SSH read's cost, which is what changes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _smoke

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path.insert(0, str(REPO))

from fleet.boxes import inventory, muxclient, sshmux  # noqa: E402
from fleet.core.config import load  # noqa: E402
from fleet.ops import check  # noqa: E402
from fleet.providers.factory import all_providers  # noqa: E402
from sandbox import fleet_toml, manage  # noqa: E402


def cpu_now() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def masters_cpu(sockets: list[str]) -> float:
    """CPU seconds the masters at `sockets` have used so far (each one's own /proc)."""
    total = 0.0
    for s in sockets:
        r = subprocess.run(["ssh", "-o", f"ControlPath={s}", "-O", "check", "fleet-mux"],
                           capture_output=True, text=True, timeout=10)
        m = re.search(r"pid=(\d+)", r.stderr)
        if not m:
            raise SystemExit(f"no master at {s}: {r.stderr.strip()}")
        # the time it ran, in ns (/proc's utime and stime count whole 10 ms ticks, which a
        # master idle between reads mostly never reaches)
        total += int(Path(f"/proc/{m.group(1)}/schedstat").read_text().split()[0]) / 1e9
    return total


def measured(rounds: int, n: int, one: Callable[[], list[Any]],
             masters: Callable[[], float] = lambda: 0.0) -> dict[str, float]:
    m0, c0 = masters(), cpu_now()
    for _ in range(rounds):
        healths = one()
        if len(healths) != n or not all(h.ssh for h in healths):
            raise SystemExit(f"not every box answered: {[h.problems for h in healths]}")
    c1, m1 = cpu_now(), masters()
    own = (c1 - c0) / (rounds * n)
    kept = (m1 - m0) / (rounds * n)
    return {"ms_per_box_check": round(1000 * own, 2), "masters_ms_per_box_check":
            round(1000 * kept, 2), "total_ms_per_box_check": round(1000 * (own + kept), 2)}


def ssh_start_ms(times: int = 100) -> float:
    """CPU ms of starting the system's `ssh` and nothing more (`ssh -V`): the floor of any read
    that starts one `ssh` client, master or not."""
    c0 = cpu_now()
    for _ in range(times):
        subprocess.run(["ssh", "-V"], capture_output=True, check=True)
    return round(1000 * (cpu_now() - c0) / times, 2)


@contextlib.contextmanager
def ssh_client_only() -> Iterator[None]:
    """Reads over the master as the system's `ssh` makes them (one `ssh` client each): the
    fleet's own mux requests (`muxclient`) refused, so every read takes its fallback."""
    def refused(socket: str, command: str, timeout: float) -> muxclient.Session:
        raise muxclient.MuxError("measuring the ssh client")

    real = muxclient.open_session
    muxclient.open_session = refused  # type: ignore[assignment]
    try:
        yield
    finally:
        muxclient.open_session = real  # type: ignore[assignment]


def run(boxes: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        base = Path(tmp)
        (base / "fleet.toml").write_text(fleet_toml.render(
            base / "state", budget=5000,
            roster=(("vast", "RTX 4090", 1), ("runpod", "RTX 4090", 1))))
        env = {**os.environ, "FLEET_CONFIG": str(base / "fleet.toml"),
               "FLEET_SANDBOX_DIR": str(base / "sandbox"), "PYINFRA_PROGRESS": "off"}
        try:
            up = subprocess.run([str(BIN / "fleet"), "sandbox", "up", "--boxes", str(boxes),
                                 "--backend", "ns", "--machines", str(max(16, boxes))],
                                cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
            if up.returncode != 0:
                raise SystemExit(f"sandbox up failed: {(up.stdout + up.stderr)[-2000:]}")
            os.environ.update({k: env[k] for k in ("FLEET_CONFIG", "FLEET_SANDBOX_DIR")})
            os.environ.update(manage.load_env(base / "sandbox"))
            cfg = load(base / "fleet.toml")
            built = inventory.build(cfg, all_providers())
            hosts = built.groups["standing"]
            if len(hosts) != boxes:
                raise SystemExit(f"{len(hosts)} boxes up, {boxes} wanted")
            fresh = inventory.Built(groups={"standing": [
                (name, {k: v for k, v in data.items() if k != "host_key"})
                for name, data in hosts]})
            before = measured(rounds, boxes, lambda: check.check(cfg, fresh))
            check.check(cfg, built)  # warm: each box's master made
            sockets = [sshmux.path(str(cfg.known_hosts), "root", d["ssh_hostname"],
                                   int(d["ssh_port"]), d["host_key"]) for _, d in hosts]
            live = [s for s in sockets if s is not None]
            after = measured(rounds, boxes, lambda: check.check(cfg, built),
                             lambda: masters_cpu(live))
            with ssh_client_only():
                client = measured(rounds, boxes, lambda: check.check(cfg, built),
                                  lambda: masters_cpu(live))
            for s in live:
                sshmux.close(s)
            return {"boxes": boxes, "rounds": rounds, "fresh": before, "reused": after,
                    "reused_by_ssh_client": client,
                    "ssh_start_ms": ssh_start_ms(),
                    "ratio": round(after["total_ms_per_box_check"]
                                   / before["total_ms_per_box_check"], 3)}
        finally:
            subprocess.run([str(BIN / "fleet"), "sandbox", "down"], cwd=REPO, env=env,
                           capture_output=True, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--boxes", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = _smoke.parse(ap, boxes=2, rounds=1)
    r = run(args.boxes, args.rounds)
    print(json.dumps({"date": datetime.now(UTC).date().isoformat(),
                      "machine": f"{os.cpu_count()} cores, {platform.platform()}", **r},
                     indent=1))


if __name__ == "__main__":
    main()
