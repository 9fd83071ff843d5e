"""The billing ledger: per-second charges at the rate each instance's state sets.

Each instance has a meter with two rates (USD per hour): GPU and storage. The world changes the
rates on every state change; the meter accrues the time spent at the old rates first, so the
totals are exact to the clock whatever the polling.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any


@dataclass
class Meter:
    provider: str
    instance_id: str
    label: str
    since: float  # last accrual time
    phase: str = "created"
    gpu_rate: float = 0.0
    storage_rate: float = 0.0
    gpu_usd: float = 0.0
    storage_usd: float = 0.0

    def accrue(self, now: float) -> None:
        hours = max(0.0, now - self.since) / 3600.0
        self.gpu_usd += self.gpu_rate * hours
        self.storage_usd += self.storage_rate * hours
        self.since = max(self.since, now)

    def to_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "id": self.instance_id,
            "label": self.label,
            "phase": self.phase,
            "gpu_usd_per_hour": self.gpu_rate,
            "storage_usd_per_hour": self.storage_rate,
            "gpu_usd": round(self.gpu_usd, 9),
            "storage_usd": round(self.storage_usd, 9),
            "total_usd": round(self.gpu_usd + self.storage_usd, 9),
        }


class Ledger:
    def __init__(self) -> None:
        self._meters: dict[str, Meter] = {}
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def set_rates(
        self, key: str, provider: str, instance_id: str, label: str,
        now: float, phase: str, gpu: float, storage: float,
    ) -> None:
        """Accrue `key` up to `now`, then bill it at the new rates (opens the meter if new)."""
        with self._lock:
            meter = self._meters.get(key)
            if meter is None:
                meter = self._meters[key] = Meter(provider, instance_id, label, now)
            meter.accrue(now)
            meter.label = label
            if (meter.phase, meter.gpu_rate, meter.storage_rate) == (phase, gpu, storage):
                return
            meter.phase, meter.gpu_rate, meter.storage_rate = phase, gpu, storage
            self._events.append(
                {"t": now, "provider": provider, "id": instance_id, "phase": phase,
                 "gpu_usd_per_hour": gpu, "storage_usd_per_hour": storage}
            )

    def meter(self, key: str, now: float) -> dict[str, Any] | None:
        with self._lock:
            meter = self._meters.get(key)
            if meter is None:
                return None
            meter.accrue(now)
            return meter.to_dict()

    def charges(self, since: float, until: float, now: float) -> list[dict[str, Any]]:
        """What each instance was charged within [since, min(until, now)]: its rate segments
        (one per state change) clipped to the window, exact to the clock."""
        end = min(until, now)
        with self._lock:
            segments: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for e in self._events:
                segments.setdefault((e["provider"], e["id"]), []).append(e)
            out = []
            for (provider, instance_id), evs in segments.items():
                meter = next((m for m in self._meters.values()
                              if (m.provider, m.instance_id) == (provider, instance_id)), None)
                gpu = storage = 0.0
                for e, nxt in zip(evs, [*evs[1:], None], strict=True):
                    t0, t1 = max(e["t"], since), min(nxt["t"] if nxt else now, end)
                    if t1 > t0:
                        gpu += e["gpu_usd_per_hour"] * (t1 - t0) / 3600.0
                        storage += e["storage_usd_per_hour"] * (t1 - t0) / 3600.0
                if gpu + storage > 0:
                    out.append({"provider": provider, "id": instance_id,
                                "label": meter.label if meter else "",
                                "start": max(since, evs[0]["t"]), "end": end,
                                "gpu_usd": gpu, "storage_usd": storage,
                                "gpu_usd_per_hour": evs[-1]["gpu_usd_per_hour"],
                                "storage_usd_per_hour": evs[-1]["storage_usd_per_hour"]})
            return out

    def snapshot(self, now: float, events: bool = True) -> dict[str, Any]:
        with self._lock:
            rows = []
            for meter in self._meters.values():
                meter.accrue(now)
                rows.append(meter.to_dict())
            out: dict[str, Any] = {
                "now": now,
                "total_usd": round(sum(r["total_usd"] for r in rows), 9),
                "usd_per_hour": round(
                    sum(r["gpu_usd_per_hour"] + r["storage_usd_per_hour"] for r in rows), 9
                ),
                "instances": rows,
            }
            if events:
                out["events"] = list(self._events)
            return out
