"""The fleet.toml a sandbox run starts from, for the integration tests and the benchmarks.

One place for the roles the sandbox's market and simulators fit: the `live` standing role
(node, miner and prover, the p2p port the node needs, driver 580.95.05 and its CUDA 13.0, the
simulators' release 1.4.0) and the `bench` one-shot role.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

LIVE_ROLE = """[roles.live]
kind = "standing"
image = "img"
disk_gb = 20
programs = ["node", "miner", "prover"]
p2p_port = 26611
admitted_driver = "580.95.05"
release = "1.4.0"
allowed_cuda = ["13.0"]
"""

BENCH_ROLE = """[roles.bench]
kind = "oneshot"
image = "img"
disk_gb = 20
admitted_driver = "580.95.05"
"""

# two standing boxes per provider, all RTX 4090
ROSTER_4090 = (("vast", "RTX 4090", 2), ("runpod", "RTX 4090", 2))


def render(state: Path | str, *, budget: float = 500, roles: str = LIVE_ROLE,
           roster: Iterable[tuple[str, str, int]] = (), loop: dict[str, float] | None = None,
           store: bool = False) -> str:
    """fleet.toml text with every path under `state`; `roster` is (provider, card, count) for
    the `live` role; `loop` the `[loop]` settings; `store` adds the output store."""
    out = [f'[fleet]\nregistry = "{state}/boxes.json"\nknown_hosts = "{state}/known_hosts"\n'
           f'ssh_key = "{state}/ssh/fleet"\nreleases = "{state}/releases"\n'
           f"daily_budget_usd = {budget}\n"]
    if loop:
        out.append("[loop]\n" + "".join(f"{k} = {v}\n" for k, v in loop.items()))
    if store:
        out.append(f'[store]\nrepo = "fleet/outputs"\narchive = "{state}/archive"\n')
    out.append(roles)
    out += [f'[[roster.live]]\nprovider = "{p}"\ncard = "{card}"\ncount = {n}\n'
            for p, card, n in roster]
    return "".join(out)
