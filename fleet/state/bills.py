"""Money from the bills: what the providers say they charged today, where they say it.

Vast lists per-instance charges (`GET /api/v0/charges/`, GPU and disk), RunPod per-pod
charges on its REST v2 host (`GET /v2/billing/pods`, five minutes behind: `billing_lag_s`);
see the clients' `charges`. A box no bill names is estimated: the recorded price times the
seconds it ran today (`estimate`).

`spent_today` asks every provider for today's charges (`read`), keeps the answer in the
fleet's state database (`save`, the `bills` document, replaced whole) and says, per registry
row, what it spent today and where the figure came from. The budget check reads that
document (`load`), never the network, because it runs in the registry's write transaction. A billed box's spent
today is its bill plus its price for the time after the bill's covered end (bills lag), but
never less than the estimate from its price (a bill may lag more than it says); a bill older
than `MAX_AGE_S` or from another day, a provider that failed, or a box the bill does not name
(yet) falls back to the estimate, and the row says why. What a fresh bill charged for boxes no
registry row names (an orphan, a label's duplicate) counts too (`Spent.unnamed`), and so does
a failed rent's box that the bill names.

The `bills` document:

    {"read_at": "2026-12-03T12:00:00Z",          when the providers were asked
     "since": "2026-12-03T00:00:00Z",            the window's start (that UTC midnight)
     "charges": {"vast": {"31234567": 1.234}},   provider -> box id -> USD in the window
     "covered": {"vast": "2026-12-03T12:00:00Z"}, provider -> up to when its bill counts
     "errors": {"runpod": "runpod GET /v2/billing/pods: HTTP 503 ..."}}
                                                 provider -> why it gave no bill
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from fleet.core.boxes import Row
from fleet.core.errors import ProviderError
from fleet.core.times import iso, parse_iso, utc_day_start
from fleet.state import docs
from fleet.state.db import open_db

MAX_AGE_S = 900.0  # an older bill says nothing about now


@dataclass
class Bills:
    read_at: str  # UTC ISO-8601: when the charges were asked for (their window ends there)
    charges: dict[str, dict[str, float]] = field(default_factory=dict)  # provider -> id -> USD
    errors: dict[str, str] = field(default_factory=dict)  # provider -> why it gave no bill
    # provider -> up to when its bill counts (RunPod's lags 5 minutes behind read_at)
    covered: dict[str, str] = field(default_factory=dict)
    since: str = ""  # the window's start: read_at's UTC midnight ("" in older files: derived)

    def age_s(self, now: datetime) -> float:
        return (now - parse_iso(self.read_at)).total_seconds()

    def window_start(self) -> datetime:
        return parse_iso(self.since) if self.since else utc_day_start(parse_iso(self.read_at))


@dataclass(frozen=True)
class SpentRow:
    """What one registry row spent today, and where the figure came from."""

    label: str
    provider: str
    usd: float
    source: str  # "bill" | "estimate"
    billed_usd: float | None = None  # what the bill said (source "bill")
    tail_usd: float = 0.0  # source "bill": price x the time after the bill's covered end
    why: str | None = None  # source "estimate": why no bill counted
    # source "bill": the estimate from its price; `usd` is the larger of it and bill + tail
    estimate_usd: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Billed(dict[str, float]):
    """Spent today by label for the rows a bill counted (`budget.project(billed=...)`), and
    `unnamed_usd`: what the bills charged today for boxes no registry row names, which
    `budget.project` counts on top of the rows."""

    def __init__(self, by_label: Mapping[str, float] | None = None,
                 unnamed_usd: float = 0.0) -> None:
        super().__init__(by_label or {})
        self.unnamed_usd = unnamed_usd


@dataclass(frozen=True)
class Spent:
    """Spent today: a row per registry row that ran today (or that a bill names), what the
    bills charged for boxes no row names, their total, and the providers whose bills failed
    (their rows are estimated)."""

    at: str  # UTC ISO-8601: the moment the figures are for
    rows: tuple[SpentRow, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)  # provider -> why no bill
    # provider -> box id -> USD a fresh bill charged today for a box no registry row names
    unnamed: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    @property
    def unnamed_usd(self) -> float:
        return sum(u for ids in self.unnamed.values() for u in ids.values())

    @property
    def total_usd(self) -> float:
        return sum(r.usd for r in self.rows) + self.unnamed_usd

    def billed(self) -> Billed:
        """Spent today by label for the rows a bill counted, with the charges no row names:
        `budget.project(billed=...)`."""
        return Billed({r.label: r.usd for r in self.rows if r.source == "bill"},
                      self.unnamed_usd)

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "total_usd": round(self.total_usd, 6),
                "from_bills": sum(1 for r in self.rows if r.source == "bill"),
                "unnamed_usd": round(self.unnamed_usd, 6),
                "unnamed": {p: dict(ids) for p, ids in self.unnamed.items()},
                "errors": dict(self.errors), "rows": [r.to_dict() for r in self.rows]}


NAME = "bills"  # its document in the state database (`fleet.state.docs`)


def read(providers: Mapping[str, Any], now: datetime | None = None) -> Bills:
    """Today's charges (UTC midnight until `now`) from every provider that reports them.
    Never raises for a provider: one that fails is named in `errors` with why."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    midnight = utc_day_start(now)
    bills = Bills(read_at=iso(now), since=iso(midnight))
    for name, p in sorted(providers.items()):
        ask = getattr(p, "charges", None)
        if ask is None:
            continue
        try:
            charged = {str(i): float(u) for i, u in ask(midnight, now).items()}
        except ProviderError as e:
            bills.errors[name] = str(e)
            continue
        except (ValueError, TypeError, AttributeError, KeyError, OSError) as e:
            bills.errors[name] = f"{name} charges: unreadable bill ({type(e).__name__})"
            continue
        bills.charges[name] = charged
        lag = timedelta(seconds=float(getattr(p, "billing_lag_s", 0.0) or 0.0))
        bills.covered[name] = iso(max(midnight, now - lag))
    return bills


def save(registry: Path, bills: Bills) -> None:
    """Replace the fleet's last bills read with `bills`, whole."""
    docs.put(open_db(registry), NAME, asdict(bills))


def refresh(registry: Path, providers: Mapping[str, Any], now: datetime | None = None) -> Bills:
    """Today's charges from every provider that reports them; saved in the fleet's state."""
    bills = read(providers, now)
    save(registry, bills)
    return bills


def load(registry: Path) -> Bills | None:
    """The last bills read, or None (none yet, or unreadable: then everything is estimated)."""
    try:
        d = docs.get(open_db(registry), NAME)
        if d is None:
            return None
        return Bills(str(d["read_at"]), {k: {str(i): float(u) for i, u in v.items()}
                                         for k, v in d["charges"].items()}, dict(d["errors"]),
                     dict(d.get("covered") or {}), str(d.get("since") or ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def estimate(row: Row, now: datetime) -> float:
    """What `row` cost since UTC midnight by its recorded prices: the hours it ran today at
    its price, plus the hours it has been stopped at its storage price (see `priced`)."""
    if row.status == "failed":
        return 0.0
    start = parse_iso(row.created_at) if row.created_at else now
    return priced(row, max(start, utc_day_start(now)), now)


def priced(row: Row, frm: datetime, to: datetime) -> float:
    """USD `row` cost between `frm` and `to` by its recorded prices: USD/h until the listing
    showed it stopped (`stopped_at`), its storage's USD/h from then. A stop of unknown storage
    price counts at the full price (an upper bound), and so does a stop that ended: the
    registry keeps only the current one."""
    end = min(parse_iso(row.destroyed_at), to) if row.destroyed_at else to
    stop = parse_iso(row.stopped_at) if row.stopped_at else end
    rate = row.usd_per_hour if row.stopped_usd_per_hour is None else row.stopped_usd_per_hour
    running = max(0.0, (min(stop, end) - frm).total_seconds())
    stopped = max(0.0, (end - max(stop, frm)).total_seconds())
    return (row.usd_per_hour * running + rate * stopped) / 3600


def ran_today(row: Row, now: datetime) -> bool:
    """Whether `row` may have billed since UTC midnight (a failed rent never did)."""
    if row.status == "failed":
        return False
    return row.destroyed_at is None or parse_iso(row.destroyed_at) >= utc_day_start(now)


def spent_from(rows: Sequence[Row], bills: Bills | None, now: datetime | None = None) -> Spent:
    """Spent today per row that ran today or that a fresh bill names, from bills already read
    (no HTTP: the budget check's way, with `load`): where a fresh bill of today names the box,
    the larger of its bill plus the price after the bill's covered end and the estimate; else
    the estimate and why. A fresh bill's charges for boxes no row names are `Spent.unnamed`."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    stale = _stale(bills, now)
    fresh = bills if stale is None else None
    errors = dict(fresh.errors) if fresh is not None else {}
    named: dict[str, set[str]] = {}
    out = []
    for r in rows:
        if r.provider_id is not None:
            named.setdefault(r.provider, set()).add(r.provider_id)
        charged = None
        if fresh is not None and r.provider_id is not None:
            charged = fresh.charges.get(r.provider, {}).get(r.provider_id)
        if charged is None and not ran_today(r, now):
            continue
        why = stale
        if fresh is not None and charged is None:
            if r.provider in fresh.errors:
                why = f"no bill from {r.provider}: {fresh.errors[r.provider]}"
            elif r.provider not in fresh.charges:
                why = f"{r.provider} gave no bill"
            else:
                why = f"not on {r.provider}'s bill (yet)"
        if charged is None or fresh is None:
            out.append(SpentRow(r.label, r.provider, estimate(r, now), "estimate", why=why))
            continue
        covered = parse_iso(fresh.covered.get(r.provider, fresh.read_at))
        start = parse_iso(r.created_at) if r.created_at else covered
        end = min(parse_iso(r.destroyed_at), now) if r.destroyed_at else now
        tail = priced(r, max(covered, start), end)
        est = estimate(r, now)
        out.append(SpentRow(r.label, r.provider, max(charged + tail, est), "bill",
                            billed_usd=charged, tail_usd=tail, estimate_usd=est))
    unnamed: dict[str, dict[str, float]] = {}
    if fresh is not None:
        for provider, charges in sorted(fresh.charges.items()):
            mine = named.get(provider, set())
            extra = {i: u for i, u in charges.items() if i not in mine and u}
            if extra:
                unnamed[provider] = extra
    return Spent(iso(now), tuple(out), errors, unnamed)


def spent_today(rows: Sequence[Row], providers: Mapping[str, Any],
                now: datetime | None = None, *, registry: Path | None = None) -> Spent:
    """Spent today per registry row (see `spent_from`), asking the providers for their bills
    now; with `registry`, the bills are also saved beside it for the budget check (`load`).
    Never raises for a provider: one whose billing call fails is in `Spent.errors` and its
    rows are estimated."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    bills = read(providers, now)
    if registry is not None:
        save(registry, bills)
    return spent_from(rows, bills, now)


def billed(rows: Sequence[Row], bills: Bills | None, now: datetime) -> Billed:
    """Spent today by label, for the rows a fresh bill names: the bill plus the price for the
    time after its covered end (a live box keeps billing), never less than the estimate. Rows
    it does not name are left out (the caller estimates them); its charges for boxes no row
    names are `unnamed_usd`."""
    return spent_from(rows, bills, now).billed()


def _stale(bills: Bills | None, now: datetime) -> str | None:
    """Why `bills` cannot count now, or None when it can."""
    if bills is None:
        return "no bill read yet"
    try:
        age = bills.age_s(now)
        day = bills.window_start()
    except ValueError:
        return "the bills file is unreadable"
    if day != utc_day_start(now):
        return "the last bill read is of another day"
    if not 0 <= age <= MAX_AGE_S:
        return f"the last bill read is {age / 60:.0f} minutes old"
    return None


