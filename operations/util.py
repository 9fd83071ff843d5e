"""Shared by the fleet's operations: one BoxState read per host and run."""

from __future__ import annotations

from typing import Any
from weakref import WeakKeyDictionary

from pyinfra.api.host import Host

from agent.contract import BOOT_SCRIPT, CONFIG, PEERS
from facts.box import BoxState

# small files the deploys manage under the fleet root, digested by every BoxState read
MANAGED = (CONFIG, BOOT_SCRIPT, PEERS)


_BOX_STATE: WeakKeyDictionary[Any, dict[str, dict[str, Any]]] = WeakKeyDictionary()


def managed_files(root: str) -> tuple[str, ...]:
    return tuple(f"{root}/{name}" for name in MANAGED)


def box_state(host: Host, root: str) -> dict[str, Any]:
    """BoxState, read once per host per pyinfra run (v3 keeps no fact cache of its own).

    Operations diff against the state the box had before this run, which is what a deploy of
    independent pieces wants; it also keeps a no-change re-run to one SSH command per box.
    """
    # keyed by the host object itself (`pyinfra.host` is a context proxy shared by every
    # host), held weakly so that a run's hosts take their reads with them
    real: Any = host._get_module() if hasattr(host, "_get_module") else host
    reads = _BOX_STATE.setdefault(real, {})
    if root not in reads:
        reads[root] = host.get_fact(BoxState, root=root, files=managed_files(root))
    return reads[root]
