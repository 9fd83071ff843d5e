"""Money from the bills: what the providers say they charged today, where they say it.

Vast lists per-instance charges (`GET /api/v0/charges/`, GPU and disk), RunPod per-pod
charges on its REST v2 host (`GET /v2/billing/pods`, five minutes behind: `billing_lag_s`);
see the clients' `charges`. A provider without a bill is estimated as before: the recorded
price times the seconds run.

`refresh` asks every provider that bills for today's charges and keeps the answer in
`bills.json` beside the registry (replaced whole); the budget check reads that file, never
the network, because it runs under the registry's lock. A box's spent today is then its bill
plus its price for the time since the bill's end; a bill older than `MAX_AGE_S`, a provider
that failed, or a box the bill does not name falls back to the estimate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fleet.errors import ProviderError
from fleet.fileutil import write_atomic
from fleet.registry import Row

MAX_AGE_S = 900.0  # an older bill says nothing about now


@dataclass
class Bills:
    read_at: str  # UTC ISO-8601: when the charges were asked for (their window ends there)
    charges: dict[str, dict[str, float]] = field(default_factory=dict)  # provider -> id -> USD
    errors: dict[str, str] = field(default_factory=dict)  # provider -> why it gave no bill
    # provider -> up to when its bill counts (RunPod's lags 5 minutes behind read_at)
    covered: dict[str, str] = field(default_factory=dict)

    def age_s(self, now: datetime) -> float:
        return (now - _parse(self.read_at)).total_seconds()


def path_for(registry: Path) -> Path:
    return registry.parent / "bills.json"


def refresh(registry: Path, providers: Mapping[str, Any], now: datetime | None = None) -> Bills:
    """Today's charges from every provider that reports them; saved beside the registry."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    bills = Bills(read_at=_iso(now))
    for name, p in sorted(providers.items()):
        ask = getattr(p, "charges", None)
        if ask is None:
            continue
        try:
            bills.charges[name] = dict(ask(midnight, now))
        except ProviderError as e:
            bills.errors[name] = str(e)
            continue
        lag = timedelta(seconds=float(getattr(p, "billing_lag_s", 0.0)))
        bills.covered[name] = _iso(max(midnight, now - lag))
    write_atomic(path_for(registry), json.dumps(asdict(bills), indent=1) + "\n")
    return bills


def load(registry: Path) -> Bills | None:
    """The last bills read, or None (none yet, or unreadable: then everything is estimated)."""
    try:
        d = json.loads(path_for(registry).read_text())
        return Bills(str(d["read_at"]), {k: {i: float(u) for i, u in v.items()}
                                         for k, v in d["charges"].items()}, dict(d["errors"]),
                     dict(d.get("covered") or {}))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def billed(rows: Sequence[Row], bills: Bills | None, now: datetime) -> dict[str, float]:
    """Spent today by label, for the rows a fresh bill names: the bill plus the price for the
    time since it was read (a live box keeps billing). Rows it does not name are left out
    (the caller estimates them)."""
    if bills is None or not 0 <= bills.age_s(now) <= MAX_AGE_S:
        return {}
    out = {}
    for r in rows:
        charged = bills.charges.get(r.provider, {})
        if r.provider_id is None or r.provider_id not in charged:
            continue
        covered = _parse(bills.covered.get(r.provider, bills.read_at))
        end = _parse(r.destroyed_at) if r.destroyed_at else now
        tail_h = max(0.0, (min(end, now) - covered).total_seconds()) / 3600
        out[r.label] = charged[r.provider_id] + r.usd_per_hour * tail_h
    return out


def _parse(ts: str) -> datetime:
    t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
