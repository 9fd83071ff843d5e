"""A thin client for the sandbox's control surface (tests, the demo, `fleet sandbox fault`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx


class ControlClient:
    def __init__(self, url: str, timeout: float = 30.0) -> None:
        self._http = httpx.Client(base_url=url, timeout=timeout)

    @classmethod
    def from_state_dir(cls, state_dir: Path) -> ControlClient:
        info = json.loads((state_dir / "daemon.json").read_text())
        return cls(info["control_url"])

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              params: dict[str, str] | None = None) -> Any:
        resp = self._http.request(method, path, json=body, params=params)
        if resp.status_code >= 400:
            raise ValueError(f"sandbox control {method} {path}: {resp.json().get('error')}")
        return resp.json()

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/health")

    def fault(self, kind: str, target: str = "*", count: int = 1, **params: Any) -> dict[str, Any]:
        """Queue a fault (or apply it at once to a named instance); see sandbox.control."""
        return self._call("POST", "/faults", {"kind": kind, "target": target, "count": count,
                                              **params})

    def faults(self) -> list[dict[str, Any]]:
        return self._call("GET", "/faults")["faults"]

    def clear_faults(self) -> int:
        return self._call("DELETE", "/faults")["cleared"]

    def ledger(self, events: bool = True) -> dict[str, Any]:
        return self._call("GET", "/ledger", params=None if events else {"events": "0"})

    def instances(self) -> list[dict[str, Any]]:
        return self._call("GET", "/instances")["instances"]

    def create_instances(self, provider: str, count: int, **options: Any) -> list[dict[str, Any]]:
        body = {"provider": provider, "count": count, **options}
        return self._call("POST", "/instances", body)["instances"]

    def machines(self) -> list[dict[str, Any]]:
        return self._call("GET", "/machines")["machines"]

    def shape_machine(self, provider: str, machine_id: str, **change: Any) -> dict[str, Any]:
        """Set a machine's `price_per_gpu`, how many GPUs `other_tenants` hold and/or its
        `direct_port_count`."""
        return self._call("POST", "/machines",
                          {"provider": provider, "machine_id": machine_id, **change})

    def advance(self, seconds: float) -> float:
        return self._call("POST", "/clock", {"advance": seconds})["now"]

    def config(self, **settings: float) -> dict[str, float]:
        return self._call("POST", "/config", dict(settings))

    def host_keys(self) -> dict[str, str]:
        return self._call("GET", "/host-keys")

    def add_ssh_key(self, key: str, provider: str | None = None) -> dict[str, int]:
        return self._call("POST", "/ssh-keys", {"key": key, "provider": provider})

    def add_account(self, provider: str) -> str:
        """A new, empty account at `provider` (`runpod`, `vast`): its API key."""
        key: str = self._call("POST", "/accounts", {"provider": provider})["key"]
        return key

    def settle(self, timeout: float = 30.0) -> bool:
        return self._call("POST", "/settle", {"timeout": timeout})["settled"]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
