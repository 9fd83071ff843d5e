"""The daily budget: no rent may push the projected UTC day past it.

Projected day = what the registry's boxes have cost since UTC midnight, plus what the live ones
will cost until the next midnight at their current price, plus the new box until midnight.
Prices are the providers' live figures recorded at rent time. What a box cost today is its
provider's bill where one was read (`fleet.bills`), else its price times the time it ran.

A rent checks the budget and writes its row in one locked step (`guard` run by
`Registry.add(check=...)`), so two rents at once cannot both fit into the same headroom.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from fleet.bills import Bills, billed, estimate
from fleet.errors import BudgetExceeded
from fleet.registry import Row, parse_iso


def _parse(ts: str | None) -> datetime | None:
    return parse_iso(ts) if ts else None


@dataclass(frozen=True)
class Projection:
    spent_usd: float  # since UTC midnight
    committed_usd: float  # live boxes until next midnight
    new_usd: float  # the box asked for, until next midnight
    budget_usd: float

    @property
    def total_usd(self) -> float:
        return self.spent_usd + self.committed_usd + self.new_usd

    @property
    def fits(self) -> bool:
        return self.total_usd <= self.budget_usd + 1e-9


def project(rows: list[Row], budget_usd: float, new_usd_per_hour: float = 0.0,
            now: datetime | None = None, new_hours: float | None = None,
            billed: Mapping[str, float] | None = None) -> Projection:
    """The projected day; `new_hours` caps the new box's hours (a one-shot job's TTL);
    `billed` is what the providers' bills say a row spent today, by label (`fleet.bills`:
    `Spent.billed()`, or `bills.billed` from the cached bills), used in place of the
    estimate from its price (`bills.estimate`)."""
    now = now or datetime.now(UTC)
    billed = billed or {}
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    left_h = (midnight + timedelta(days=1) - now).total_seconds() / 3600
    spent = committed = 0.0
    for r in rows:
        if r.status == "failed":
            continue
        spent += billed[r.label] if r.label in billed else estimate(r, now)
        if r.destroyed_at is None and r.live:
            committed += r.usd_per_hour * _hours_left(now, left_h, _parse(r.expires_at))
    new_h = left_h if new_hours is None else min(left_h, new_hours)
    return Projection(spent, committed, new_usd_per_hour * new_h, budget_usd)


def _hours_left(now: datetime, left_h: float, expires: datetime | None) -> float:
    """Hours a live box still bills today: until midnight, or until its TTL if that is
    sooner. A box already past its TTL is still billing, and nothing says when it stops:
    until midnight (the watchdog flags it)."""
    if expires is None or expires <= now:
        return left_h
    return min(left_h, (expires - now).total_seconds() / 3600)


def project_new(rows: list[Row], budget_usd: float, new_usd_per_hour: float,
                replacing: str | None = None, now: datetime | None = None,
                new_hours: float | None = None,
                billed: Mapping[str, float] | None = None) -> Projection:
    """The projected day with a new box; a live row labelled `replacing` (an unfinished rent
    whose place the new box takes) counts what it has cost until now and nothing after."""
    if replacing is not None:
        end = (now or datetime.now(UTC)).isoformat()
        rows = [replace(r, destroyed_at=end) if r.label == replacing and r.live else r
                for r in rows]
    return project(rows, budget_usd, new_usd_per_hour, now, new_hours, billed)


def guard(budget_usd: float, new_usd_per_hour: float, what: str,
          replacing: str | None = None, new_hours: float | None = None,
          bills: Bills | None = None) -> Callable[[list[Row]], None]:
    """The budget check of one rent, for `Registry.add(check=...)`: it runs under the
    registry's lock with the rows as they stand and raises BudgetExceeded when the box does
    not fit (see `project_new` for `replacing`). `bills`: the last bills read
    (`bills.load(registry)`): the rows a fresh one names count their bill (`bills.billed`);
    never HTTP under the lock."""

    def check(rows: list[Row]) -> None:
        now = datetime.now(UTC)
        require_fits(project_new(rows, budget_usd, new_usd_per_hour, replacing, now=now,
                                 new_hours=new_hours, billed=billed(rows, bills, now)), what)

    return check


def require_fits(p: Projection, what: str) -> None:
    if not p.fits:
        raise BudgetExceeded(
            f"{what} refused: projected day ${p.total_usd:.2f} would pass the daily budget "
            f"${p.budget_usd:.2f} (spent today ${p.spent_usd:.2f}, live boxes until midnight "
            f"${p.committed_usd:.2f}, this box ${p.new_usd:.2f})")
