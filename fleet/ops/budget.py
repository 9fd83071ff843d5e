"""The daily budget: no rent may push the projected UTC day, or the fleet's daily run rate,
past it.

Projected day = what the registry's boxes have cost since UTC midnight, plus what the live ones
will cost until the next midnight at their current price, plus the new box until midnight.
Run rate = a whole day of the fleet as it would stand: every live box's USD/h for 24 hours (a
one-shot box only until its TTL, if sooner), plus the new box for 24 hours (or its TTL). The
projected day alone would let a box rented at 23:55 cost a few minutes of today and all of
tomorrow; the run rate alone would ignore what today already cost. A rent must fit both.

Prices are the providers' live figures recorded at rent time. What a box cost today is the
larger of its provider's bill (plus its price for the time the bill does not cover yet) where
one was read (`fleet.state.bills`), and its price times the time it ran; a bill's charges for boxes
no row names (`Billed.unnamed_usd`) and for failed rents' boxes count too.

The run rate counts the account, not only the registry: every box a provider lists that no
live row owns (a person's box, another registry's fleet) counts at its listed price from now
on, each once (`unowned_boxes`). A listing that cannot be read, or a listed box whose price cannot
be read or is not listed at all (never taken for $0), refuses the rent: the budget never counts
less than it cannot see.

A rent checks the budget and writes its row in one locked step (`guard` run by
`Registry.add(check=...)`), so two rents at once cannot both fit into the same headroom.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from fleet.core.errors import BudgetExceeded, ProviderError
from fleet.core.states import BoxStatus
from fleet.core.times import next_utc_day_start, parse_iso, utc_day
from fleet.providers.base import Box, Unreadable
from fleet.state.bills import Bills, billed, estimate

if TYPE_CHECKING:
    from fleet.core.boxes import Row
    from fleet.providers.base import Provider

Listing = Sequence[Box | Unreadable]  # every box the providers list on the account


@dataclass(frozen=True)
class Projection:
    spent_usd: float  # since UTC midnight (the bills' charges for boxes no row names included)
    committed_usd: float  # live boxes until next midnight
    new_usd: float  # the box asked for, until next midnight
    budget_usd: float
    rate_usd: float = 0.0  # live boxes for the next 24 h (one-shots until their TTL)
    new_rate_usd: float = 0.0  # the box asked for, for 24 h (a one-shot: its TTL)
    unowned: int = 0  # boxes on the account no live row owns, counted in the two above
    unowned_rate_usd: float = 0.0  # their part of rate_usd

    @property
    def total_usd(self) -> float:
        """The projected day."""
        return self.spent_usd + self.committed_usd + self.new_usd

    @property
    def run_rate_usd(self) -> float:
        """A day of the fleet as it would stand with the new box."""
        return self.rate_usd + self.new_rate_usd

    @property
    def fits_day(self) -> bool:
        return self.total_usd <= self.budget_usd + 1e-9

    @property
    def fits_rate(self) -> bool:
        return self.run_rate_usd <= self.budget_usd + 1e-9

    @property
    def fits(self) -> bool:
        return self.fits_day and self.fits_rate


def project(rows: list[Row], budget_usd: float, new_usd_per_hour: float = 0.0,
            now: datetime | None = None, new_hours: float | None = None,
            billed: Mapping[str, float] | None = None,
            unowned: Sequence[Box] = ()) -> Projection:
    """The projected day and the run rate; `new_hours` caps the new box's hours (a one-shot
    job's TTL); `billed` is what the providers' bills say a row spent today, by label
    (`fleet.state.bills`: `Spent.billed()`, or `bills.billed` from the cached bills): a row counts
    the larger of it and the estimate from its price (`bills.estimate`), and a `Billed`'s
    `unnamed_usd` (charges for boxes no row names) counts on top. `unowned`: the boxes on the
    account that no live row owns (`unowned_boxes`), each at its listed price until midnight and for
    the next 24 h (what they spent today is on the bills, as charges no row names)."""
    now = now or datetime.now(UTC)
    billed = {} if billed is None else billed  # an empty Billed still has its unnamed_usd
    left_h = (next_utc_day_start(now) - now).total_seconds() / 3600
    spent = float(getattr(billed, "unnamed_usd", 0.0))
    committed = rate = 0.0
    for r in rows:
        if r.status == "failed":  # never billed, unless a bill says it did
            spent += billed.get(r.label, 0.0)
            continue
        est = estimate(r, now)
        spent += max(billed[r.label], est) if r.label in billed else est
        if r.destroyed_at is None and r.live:
            expires = parse_iso(r.expires_at) if r.expires_at else None
            committed += r.usd_per_hour * _hours_left(now, left_h, expires)
            rate += r.usd_per_hour * _hours_left(now, 24.0, expires)
    others = sum(b.usd_per_hour for b in unowned)
    committed += others * left_h
    rate += others * 24.0
    new_h = left_h if new_hours is None else min(left_h, new_hours)
    new_day_h = 24.0 if new_hours is None else min(24.0, new_hours)
    return Projection(spent, committed, new_usd_per_hour * new_h, budget_usd, rate,
                      new_usd_per_hour * new_day_h, len(unowned), others * 24.0)


def _hours_left(now: datetime, left_h: float, expires: datetime | None) -> float:
    """Hours a live box still bills within the next `left_h`: all of them, or until its TTL
    if that is sooner. A box already past its TTL is still billing, and nothing says when it
    stops: all of them (the watchdog flags it)."""
    if expires is None or expires <= now:
        return left_h
    return min(left_h, (expires - now).total_seconds() / 3600)


def project_new(rows: list[Row], budget_usd: float, new_usd_per_hour: float,
                replacing: str | None = None, now: datetime | None = None,
                new_hours: float | None = None,
                billed: Mapping[str, float] | None = None,
                unowned: Sequence[Box] = ()) -> Projection:
    """The projected day with a new box; a live row labelled `replacing` (an unfinished rent
    whose place the new box takes) counts what it has cost until now and nothing after."""
    if replacing is not None:
        end = (now or datetime.now(UTC)).isoformat()
        rows = [replace(r, destroyed_at=end) if r.label == replacing and r.live else r
                for r in rows]
    return project(rows, budget_usd, new_usd_per_hour, now, new_hours, billed, unowned)


def listed(providers: Mapping[str, Provider], what: str) -> list[Box | Unreadable]:
    """Every box `providers` list on the account, owned by the registry or not, for `guard`:
    read before the registry's lock, never under it. A listing that fails refuses the rent
    (BudgetExceeded, one line): what the budget cannot see, it cannot count."""
    out: list[Box | Unreadable] = []
    for name, p in providers.items():
        try:
            out.extend(p.boxes())
        except ProviderError as e:
            raise BudgetExceeded(f"{what} refused: {name}'s listing of the account failed, so "
                                 f"the budget cannot count its boxes ({e})") from None
    return out


def unowned_boxes(rows: Sequence[Row], boxes: Listing, what: str) -> list[Box]:
    """The listed boxes no live row owns, which the rows therefore do not count: a row owns
    the box it names by id, or, while it knows no id (an unfinished rent), one box listed under
    its label. A listed box whose row is destroyed still bills, so it counts. A listing row
    that cannot be read (`Unreadable`) is a live row's by its id, or, its id unread, by its
    label; any other counts at its price where that still reads, and with no price to count
    it is BudgetExceeded, naming it. So is a listed box whose provider lists no price for it
    (`Box.priced`): it bills at a rate the fleet cannot know, and never counts as free."""
    ids = {(r.provider, r.provider_id) for r in rows if r.live and r.provider_id}
    waiting = {(r.provider, r.label) for r in rows if r.live and not r.provider_id}
    labels = {(r.provider, r.label) for r in rows if r.live}
    out: list[Box] = []
    for b in boxes:
        if isinstance(b, Unreadable):
            if (b.provider, b.box_id) in ids or (
                    b.box_id is None and (b.provider, b.label) in labels):
                continue
            if b.usd_per_hour is None:
                raise BudgetExceeded(f"{what} refused: the budget cannot count a box on the "
                                     f"account whose price cannot be read: {b}")
            out.append(Box(b.provider, b.box_id or "?", b.label or "", "", 0, b.usd_per_hour,
                           BoxStatus.UNKNOWN))
            continue
        if (b.provider, b.box_id) in ids:
            continue
        if (b.provider, b.label) in waiting:
            waiting.discard((b.provider, b.label))  # the row counts this one; a second bills
            continue
        if not b.priced:
            raise BudgetExceeded(
                f"{what} refused: price of box {b.label or 'unlabelled'} ({b.provider}/"
                f"{b.box_id}) unknown: {b.provider} lists no price for it, and the budget "
                "will not count a box on the account as free")
        out.append(b)
    return out


def guard(budget_usd: float, new_usd_per_hour: float, what: str,
          replacing: str | None = None, new_hours: float | None = None,
          bills: Bills | None = None, now: datetime | None = None, *,
          account: Listing) -> Callable[[list[Row]], None]:
    """The budget check of one rent, for `Registry.add(check=...)`: it runs under the
    registry's lock with the rows as they stand and raises BudgetExceeded when the box does
    not fit the projected day or the run rate (see `project_new` for `replacing`). `bills`:
    the last bills read (`bills.load(registry)`): the rows a fresh one names count their bill
    (`bills.billed`); never HTTP under the lock. `now`: the moment checked (default: when the
    check runs). `account`: every box the providers list (`listed`, read before the lock): the
    ones no row owns count too (`unowned_boxes`)."""

    def check(rows: list[Row]) -> None:
        at = now or datetime.now(UTC)
        require_fits(project_new(rows, budget_usd, new_usd_per_hour, replacing, now=at,
                                 new_hours=new_hours, billed=billed(rows, bills, at),
                                 unowned=unowned_boxes(rows, account, what)), what)

    return check


def require_fits(p: Projection, what: str) -> None:
    """BudgetExceeded, one line naming the check (or checks) that failed and its figures,
    unless `p` fits."""
    if p.fits:
        return
    why = []
    if not p.fits_day:
        why.append(f"projected day ${p.total_usd:.2f} would pass the daily budget "
                   f"${p.budget_usd:.2f} (spent today ${p.spent_usd:.2f}, live boxes until "
                   f"midnight ${p.committed_usd:.2f}, this box ${p.new_usd:.2f})")
    if not p.fits_rate:
        why.append(f"run rate ${p.run_rate_usd:.2f} a day would pass the daily budget "
                   f"${p.budget_usd:.2f} (live boxes ${p.rate_usd:.2f} over the next 24 h"
                   f"{_unowned(p)}, this box ${p.new_rate_usd:.2f})")
    raise BudgetExceeded(f"{what} refused: {'; and '.join(why)}")


def _unowned(p: Projection) -> str:
    if not p.unowned:
        return ""
    return (f", of which ${p.unowned_rate_usd:.2f} for {p.unowned} box"
            f"{'es' if p.unowned > 1 else ''} on the account the registry does not own")


@dataclass(frozen=True)
class Rate:
    """What boxes cost at their prices: an hour of them, and a day (24 of those hours)."""

    usd_per_hour: float

    @property
    def usd_per_day(self) -> float:
        return self.usd_per_hour * 24


def rate(usd_per_hour: Iterable[float]) -> Rate:
    """The boxes' prices summed: the live and the standing boxes' totals of the roster and the
    page (a box's price is its provider's live figure recorded at rent time)."""
    return Rate(sum(usd_per_hour, 0.0))


@dataclass(frozen=True)
class Today:
    """The day's money as the roster and the page show it: the projection, how many boxes a
    bill counted, and how many of today's boxes (not failed, not destroyed before midnight)
    a bill counted."""

    day: Projection
    billed: int
    from_bills: int
    boxes: int

    def to_dict(self) -> dict[str, Any]:
        p = self.day
        return {
            "spent_today_usd": round(p.spent_usd, 6),
            # how many of today's boxes were counted from a bill; the rest are estimated
            "spent_from_bills": {"boxes": self.from_bills, "of": self.boxes},
            "boxes_from_bills": self.billed,
            "committed_until_midnight_usd": round(p.committed_usd, 6),
            "projected_day_usd": round(p.spent_usd + p.committed_usd, 6),
            "run_rate_usd_per_day": round(p.rate_usd, 6),
            "daily_budget_usd": p.budget_usd,
            "headroom_usd": round(p.budget_usd - p.spent_usd - p.committed_usd, 6),
            "fits": p.fits,
        }


def today(rows: Sequence[Row], daily_budget_usd: float, now: datetime,
          billed: Mapping[str, float] | None) -> Today:
    """Spent today (from the bills where `billed` names a box, else estimated), committed until
    midnight, the run rate and the budget: the one place the fleet's money is summed."""
    day = utc_day(now)  # a written time of this day or later sorts at or after it
    day_rows = [r for r in rows if r.status != "failed" and (r.destroyed_at is None
                                                             or r.destroyed_at >= day)]
    billed = {} if billed is None else billed
    return Today(project(list(rows), daily_budget_usd, now=now, billed=billed),
                 len(billed), sum(1 for r in day_rows if r.label in billed), len(day_rows))

