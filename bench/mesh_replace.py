"""The mesh after a replacement: from the new box's conversion to every peers file naming it
and its node dialled by two peers.

    .venv/bin/python bench/mesh_replace.py [--interval 10] [--rounds 3] [--smoke]
                                                                    (root: sandbox boxes)

A fresh sandbox, a roster of four standing RTX 4090 boxes (two per provider), settled by the
loop; then `fleet loop --interval N --json` runs while a Vast box's host dies, once per round.
From the moment the new box's row is marked standing (by the standing deploy) the script polls
every box over SSH (about once a second: the figures' resolution): every other live box's
`peers.txt` holding the new box's public p2p endpoint, and the new box's node holding two
inbound TCP connections on its p2p port (`ss`, as the sandbox test counts them). The
conversion's end is the loop's own (its tick's start, to the second, plus
`converged_after_s`: the standing deploy and the testinfra checks passed). Target: both
within one loop interval of the conversion's end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _smoke

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
from loop import Sandbox, _epoch  # noqa: E402

from fleet.boxes import boxssh  # noqa: E402
from fleet.core.boxes import Row  # noqa: E402
from fleet.core.config import load  # noqa: E402
from fleet.state.registry import Registry  # noqa: E402

P2P = 26611  # the live role's p2p port (sandbox/fleet_toml.py)


def ssh(cfg: Any, row: Row, command: str) -> str:
    r = boxssh.run(cfg, row, command)
    return r.stdout if r.returncode == 0 else ""


def inbound(cfg: Any, row: Row) -> int:
    lines = ssh(cfg, row, "ss -Htn state established").splitlines()
    return sum(1 for ln in lines if ln.split() and ln.split()[-2].endswith(f":{P2P}"))


def ticks_in(log: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in log.read_text().splitlines() if ln.startswith("{")]


def one_round(sb: Sandbox, base: Path, interval: float) -> dict[str, Any]:
    cfg = load(base / "fleet.toml")
    reg = Registry(cfg.registry)
    victim = next(r for r in reg.rows() if r.live and r.provider == "vast" and r.standing)
    log = base / "loop.jsonl"
    loop = sb.loop(log, "--interval", str(interval))
    try:
        sb.fleet("sandbox", "fault", "host_death", victim.label)
        deadline = time.monotonic() + 1800
        new = None
        while time.monotonic() < deadline:
            sb.alive(loop, log)
            new = next((r for r in Registry(cfg.registry).rows() if r.rerent_of == victim.label
                        and r.live and r.standing_since), None)
            if new is not None:
                break
            time.sleep(0.2)
        if new is None:
            raise SystemExit("no replacement converted within 30 minutes")
        endpoint = f"{new.public_ip}:{new.p2p_public_port}"
        peers_at = dialled_at = None
        while (peers_at is None or dialled_at is None) and time.monotonic() < deadline:
            sb.alive(loop, log)
            now = time.time()
            others = [r for r in Registry(cfg.registry).rows()
                      if r.live and r.standing and r.label != new.label]
            if peers_at is None and others and all(
                    endpoint in ssh(cfg, r, "cat /root/fleet/peers.txt").split()
                    for r in others):
                peers_at = now
            if dialled_at is None and inbound(cfg, new) >= 2:
                dialled_at = now
            time.sleep(0.2)
        while not any(new.label in t["converged"] for t in ticks_in(log)) \
                and time.monotonic() < deadline:
            sb.alive(loop, log)
            time.sleep(0.2)  # the tick that converted it is printed once it ends
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=300)
    if peers_at is None or dialled_at is None:
        raise SystemExit("the replacement never joined the mesh within 30 minutes")
    tick = next(t for t in ticks_in(log) if new.label in t["converged"])
    converted = _epoch(tick["started_at"]) + tick["converged_after_s"]
    return {"victim": victim.label, "replacement": new.label,
            "conversion_s": tick["converge_s"],
            "peers_files_s": round(peers_at - converted, 1),
            "two_inbound_s": round(dialled_at - converted, 1),
            "within_one_interval": max(peers_at, dialled_at) - converted <= interval}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = _smoke.parse(ap, interval=5.0, rounds=1)
    if os.geteuid() != 0:
        raise SystemExit("sandbox boxes need root (namespaces)")
    out: dict[str, Any] = {"date": datetime.now(UTC).date().isoformat(),
                           "machine": f"{os.cpu_count()} cores, {platform.platform()}",
                           "interval_s": args.interval, "rounds": []}
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        sb = Sandbox(Path(tmp), 4, args.interval)
        sb.machines = 64  # each round's host death takes a machine out of the market
        with sb:
            rounds(sb, Path(tmp), args.interval, args.rounds, out)
    print(json.dumps(out, indent=1))


def rounds(sb: Sandbox, base: Path, interval: float, n: int, out: dict[str, Any]) -> None:
    sb.settle(4)
    for _ in range(n):
        out["rounds"].append(one_round(sb, base, interval))
        print(json.dumps(out["rounds"][-1]), file=sys.stderr, flush=True)
        sb.settle(4)


if __name__ == "__main__":
    main()
