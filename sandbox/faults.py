"""Queued faults: what the control surface injects and the fake APIs consume, in order.

A fault has a kind, a target and a count. Request faults (`REQUEST_KINDS`) hit the next `count`
API calls that match the target: a provider (`runpod`, `vast`), a call name or alias
(`podFindAndDeployOnDemand`, `create`, `search`, ...), either qualified (`vast.create`), or `*`.
Instance faults (`INSTANCE_KINDS`) hit an instance at once when the target names one (id or
label); otherwise they wait for the next `count` matching instances (see `World`). `sshd_hang`
makes the box's sshd log every new session in and never run its command (a hung login: stuck
storage under the home, a stuck PAM) while the box runs on; `sshd_heal` undoes it, and only
for a named instance. Provider faults (`PROVIDER_KINDS`) target a provider and hold until
undone: `ssh_path_cut` drops every connection to its boxes' SSH ports (an SSH proxy that is
down) while the boxes, their other ports and the API run on; `ssh_path_restore` undoes it.
"""

from __future__ import annotations

import threading
from dataclasses import asdict, dataclass, field
from typing import Any

REQUEST_KINDS = frozenset(
    {"no_capacity", "offer_gone", "rate_limit", "server_error", "create_timeout", "low_bid",
     "listing_gap"}
)
# listing_gap: a listing that answers 200 but leaves out the box labelled `drop` (Vast)
# heartbeat_lost: the provider stops vouching for the box's host (Vast `unknown`, RunPod
# "Host machine is unreachable") while the box itself runs on and answers SSH
INSTANCE_KINDS = frozenset({"host_death", "driver_drift", "container_restart", "preempt",
                            "heartbeat_lost", "sshd_hang", "sshd_heal"})
PROVIDER_KINDS = frozenset({"ssh_path_cut", "ssh_path_restore"})
KINDS = REQUEST_KINDS | INSTANCE_KINDS | PROVIDER_KINDS


class FaultError(ValueError):
    """A fault request the sandbox cannot honour (unknown kind, bad target)."""


@dataclass(frozen=True)
class Call:
    """One API call as the fault queue sees it."""

    provider: str
    name: str  # the provider's own name: GraphQL root field, or the Vast route's verb
    aliases: frozenset[str] = frozenset()  # provider-neutral: create, search, list, ...

    def matched_by(self, target: str) -> bool:
        names = {self.name, *self.aliases}
        return target in {"*", self.provider} or any(
            target in (n, f"{self.provider}.{n}") for n in names
        )


@dataclass
class Fault:
    id: int
    kind: str
    target: str
    count: int  # how many more calls/instances it hits
    params: dict[str, Any] = field(default_factory=dict)
    hits: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class FaultBook:
    """The pending faults, consumed first-in first-out per matching call."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._ids = 0
        self._lock = threading.Lock()

    def add(self, kind: str, target: str, count: int = 1, **params: Any) -> Fault:
        if kind not in KINDS:
            raise FaultError(f"unknown fault kind {kind!r}; known: {', '.join(sorted(KINDS))}")
        if count < 1:
            raise FaultError("count must be at least 1")
        with self._lock:
            self._ids += 1
            fault = Fault(self._ids, kind, target, count, dict(params))
            self._faults.append(fault)
            return fault

    def take(self, call: Call, kinds: frozenset[str] | set[str]) -> Fault | None:
        """The oldest pending fault of one of `kinds` whose target matches `call`, used once."""
        return self._take(lambda f: f.kind in kinds and call.matched_by(f.target))

    def take_instance(self, kind: str, provider: str, names: set[str]) -> Fault | None:
        """The oldest queued instance fault of `kind` for a new instance of `provider`."""
        return self._take(
            lambda f: f.kind == kind and (f.target in {"*", provider} or f.target in names)
        )

    def _take(self, match: Any) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if match(fault):
                    fault.count -= 1
                    fault.hits += 1
                    if fault.count == 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def pending(self) -> list[dict[str, Any]]:
        with self._lock:
            return [f.to_dict() for f in self._faults]

    def clear(self) -> int:
        with self._lock:
            n = len(self._faults)
            self._faults.clear()
            return n
