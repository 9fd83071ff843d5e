"""Shared by the fleet's operations: one BoxState read per host and run."""

from __future__ import annotations

from typing import Any

from pyinfra.api.host import Host

from facts.box import BoxState

# small files the deploys manage under the fleet root, digested by every BoxState read
MANAGED = ("agent.toml", "boot.sh", "peers.txt")
# the start hooks a box's provider runs at container start (RunPod's images run /post_start.sh
# from their start script; Vast runs the instance's onstart, which the fleet points at boot.sh)
HOOKS: dict[str, tuple[str, ...]] = {"runpod": ("/post_start.sh",), "vast": ()}


def managed_files(host: Host, root: str) -> tuple[str, ...]:
    return tuple(f"{root}/{name}" for name in MANAGED) + HOOKS.get(
        str(host.data.get("provider")), ())


def box_state(host: Host, root: str) -> dict[str, Any]:
    """BoxState, read once per host per pyinfra run (v3 keeps no fact cache of its own).

    Operations diff against the state the box had before this run, which is what a deploy of
    independent pieces wants; it also keeps a no-change re-run to one SSH command per box.
    """
    # keyed by run and host name: `pyinfra.host` is a context proxy, not the host itself
    key = (id(host.state), host.name, root)
    hit = _CACHE.get(key)
    if hit is None or hit[0] is not host.state:  # an id can be reused by a later run's State
        hit = _CACHE[key] = (host.state, host.get_fact(
            BoxState, root=root, files=managed_files(host, root)))
    return hit[1]


_CACHE: dict[tuple[int, str, str], tuple[object, dict[str, Any]]] = {}
