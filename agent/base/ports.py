"""The p2p port mapping a provider gave this container, read from its environment.

RunPod sets RUNPOD_PUBLIC_IP and RUNPOD_TCP_PORT_<internal>; Vast sets PUBLIC_IPADDR and
VAST_TCP_PORT_<internal>. A shell reached over SSH does not always carry the container's
environment, so variables missing from ours are looked up in PID 1's (/proc/1/environ).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

PROVIDERS = (
    ("runpod", "RUNPOD_PUBLIC_IP", "RUNPOD_TCP_PORT_"),
    ("vast", "PUBLIC_IPADDR", "VAST_TCP_PORT_"),
)


@dataclass(frozen=True)
class P2PMapping:
    mapped: bool
    internal_port: int
    provider: str | None = None
    public_ip: str | None = None
    public_port: int | None = None
    reason: str | None = None  # why there is no mapping

    def as_dict(self) -> dict[str, Any]:
        return {"mapped": self.mapped, "internal_port": self.internal_port,
                "provider": self.provider, "public_ip": self.public_ip,
                "public_port": self.public_port, "reason": self.reason}


def container_environ() -> dict[str, str]:
    """Our environment, completed with PID 1's where we lack a variable."""
    merged: dict[str, str] = {}
    try:
        with open("/proc/1/environ", "rb") as f:
            for item in f.read().split(b"\0"):
                key, sep, value = item.partition(b"=")
                if sep:
                    merged[key.decode(errors="replace")] = value.decode(errors="replace")
    except OSError:
        pass
    merged.update(os.environ)
    return merged


def find_p2p(internal_port: int, env: Mapping[str, str] | None = None) -> P2PMapping:
    if internal_port <= 0:
        return P2PMapping(False, internal_port, reason="no p2p_port configured")
    env = container_environ() if env is None else env
    for provider, ip_var, port_prefix in PROVIDERS:
        port_var = f"{port_prefix}{internal_port}"
        ip = env.get(ip_var, "").strip()
        port_text = env.get(port_var, "").strip()
        has_any = bool(ip) or any(k.startswith(port_prefix) for k in env)
        if not has_any:
            continue
        if not ip:
            return P2PMapping(False, internal_port, provider, reason=f"{ip_var} is not set")
        if not port_text:
            return P2PMapping(
                False, internal_port, provider, ip,
                reason=f"{provider} maps no public port to {internal_port} ({port_var} is not set)",
            )
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            return P2PMapping(
                False, internal_port, provider, ip,
                reason=f"{port_var}={port_text!r} is not a port",
            )
        return P2PMapping(True, internal_port, provider, ip, int(port_text))
    return P2PMapping(
        False, internal_port,
        reason="no provider port environment (RUNPOD_PUBLIC_IP/RUNPOD_TCP_PORT_* "
        "or PUBLIC_IPADDR/VAST_TCP_PORT_*)",
    )
