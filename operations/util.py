"""Shared by the fleet's operations: one BoxState read per host and run."""

from __future__ import annotations

from typing import Any

from pyinfra.api.host import Host

from agent.contract import BOOT_SCRIPT, CONFIG, PEERS
from facts.box import BoxState

# small files the deploys manage under the fleet root, digested by every BoxState read
MANAGED = (CONFIG, BOOT_SCRIPT, PEERS)


def managed_files(root: str) -> tuple[str, ...]:
    return tuple(f"{root}/{name}" for name in MANAGED)


def box_state(host: Host, root: str) -> dict[str, Any]:
    """BoxState, read once per host per pyinfra run (v3 keeps no fact cache of its own).

    Operations diff against the state the box had before this run, which is what a deploy of
    independent pieces wants; it also keeps a no-change re-run to one SSH command per box.
    """
    # `pyinfra.host` is a context proxy shared by every host: cache on the host object itself
    real: Any = host._get_module() if hasattr(host, "_get_module") else host
    cache: dict[str, dict[str, Any]] = real.__dict__.setdefault("_fleet_box_state", {})
    if root not in cache:
        cache[root] = host.get_fact(BoxState, root=root, files=managed_files(root))
    return cache[root]
