"""The billing ledger: per-second charges at the rate each instance's state sets.

Each instance has a meter with two rates (USD per hour): GPU and storage. The world changes the
rates on every state change; the meter accrues the time spent at the old rates first, so the
totals are exact to the clock whatever the polling. It also keeps each stretch of time at one
pair of rates (a `Segment`), so what any window of time cost (`charges`, what the fake billing
endpoints answer) is exact too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass
class Segment:
    """A stretch of time an instance billed at one pair of rates (USD per hour)."""

    start: float
    end: float | None  # None: still billing at these rates
    phase: str
    gpu_rate: float
    storage_rate: float

    def hours_within(self, since: float, until: float) -> float:
        """Hours of this segment inside [since, until] (`until` also ends an open one)."""
        stop = until if self.end is None else min(self.end, until)
        return max(0.0, stop - max(self.start, since)) / 3600.0


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
    segments: list[Segment] = field(default_factory=list)  # oldest first, the last one open

    def accrue(self, now: float) -> None:
        hours = max(0.0, now - self.since) / 3600.0
        self.gpu_usd += self.gpu_rate * hours
        self.storage_usd += self.storage_rate * hours
        self.since = max(self.since, now)

    def window(self, since: float, until: float) -> dict[str, Any] | None:
        """What this meter charged within [since, until], or None when nothing: GPU and
        storage dollars, the first and last charged moment, and one item per kind and rate
        (`{"kind": "gpu"|"storage", "usd_per_hour", "hours", "usd"}`)."""
        items: dict[tuple[str, float], float] = {}  # (kind, rate) -> hours
        first = last = None
        for seg in self.segments:
            hours = seg.hours_within(since, until)
            if hours <= 0 or seg.gpu_rate + seg.storage_rate <= 0:
                continue
            t0 = max(seg.start, since)
            first = t0 if first is None else first
            last = t0 + hours * 3600.0
            for kind, rate in (("gpu", seg.gpu_rate), ("storage", seg.storage_rate)):
                if rate > 0:
                    items[(kind, rate)] = items.get((kind, rate), 0.0) + hours
        if first is None or last is None:
            return None
        parts = [{"kind": k, "usd_per_hour": rate, "hours": h, "usd": rate * h}
                 for (k, rate), h in items.items()]
        return {
            "provider": self.provider, "id": self.instance_id, "label": self.label,
            "start": first, "end": last,
            "gpu_usd": sum(p["usd"] for p in parts if p["kind"] == "gpu"),
            "storage_usd": sum(p["usd"] for p in parts if p["kind"] == "storage"),
            "gpu_usd_per_hour": self.gpu_rate, "storage_usd_per_hour": self.storage_rate,
            "items": parts,
        }

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
        """Accrue `key` up to `now`, then bill it at the new rates (opens the meter if new):
        the open rate segment ends at `now` and a new one starts there."""
        with self._lock:
            meter = self._meters.get(key)
            if meter is None:
                meter = self._meters[key] = Meter(provider, instance_id, label, now)
            meter.accrue(now)
            meter.label = label
            if (meter.phase, meter.gpu_rate, meter.storage_rate) == (phase, gpu, storage):
                return
            meter.phase, meter.gpu_rate, meter.storage_rate = phase, gpu, storage
            if meter.segments and meter.segments[-1].end is None:
                meter.segments[-1].end = max(now, meter.segments[-1].start)
            meter.segments.append(Segment(now, None, phase, gpu, storage))
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

    def segments(self, key: str) -> list[Segment]:
        """The rate segments of `key` (copies), oldest first; [] for an unknown key."""
        with self._lock:
            meter = self._meters.get(key)
            return [replace(s) for s in meter.segments] if meter else []

    def charges(self, since: float, until: float, now: float,
                provider: str | None = None) -> list[dict[str, Any]]:
        """What each instance (of `provider`, or all) was charged within
        [since, min(until, now)]: its rate segments clipped to the window, exact to the
        clock; instances that charged nothing there are left out. See `Meter.window`."""
        end = min(until, now)
        if end <= since:
            return []
        with self._lock:
            found = (m.window(since, end) for m in self._meters.values()
                     if provider in (None, m.provider))
            return [c for c in found if c is not None]

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
