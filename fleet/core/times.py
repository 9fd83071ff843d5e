"""The fleet's one form of time: UTC, to the second, written "2026-12-03T12:00:00Z".

`parse_iso` is strict (a registry or a bill that holds a broken time is broken); `read_iso`
reads leniently, for views that show "unknown" rather than stop. A day is a UTC day, from one
UTC midnight (`utc_day_start`) to the next (`next_utc_day_start`), named "2026-12-03"
(`utc_day`): the budget's, the bills', the chart's and the page's days are all this one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def now_iso() -> str:
    return iso(datetime.now(UTC))


def iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_iso(ts: str) -> datetime:
    """An aware UTC datetime (a naive one is read as UTC); ValueError when `ts` is not a time."""
    t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    if not t.tzinfo:
        return t.replace(tzinfo=UTC)
    try:  # in UTC whatever offset it was written with: every time the fleet shows is UTC
        return t.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-02:00 has no UTC time
        raise ValueError(f"{ts!r} has no UTC time") from None


def utc_day_start(t: datetime) -> datetime:
    """The UTC midnight that starts `t`'s UTC day (a naive `t` is read as UTC, as `parse_iso`
    reads one)."""
    t = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


def next_utc_day_start(t: datetime) -> datetime:
    """The UTC midnight that ends `t`'s UTC day."""
    return utc_day_start(t) + timedelta(days=1)


def utc_day(t: datetime) -> str:
    """`t`'s UTC day, "2026-12-03": what a written time (`iso`) starts with on that day."""
    return utc_day_start(t).date().isoformat()


def read_iso(ts: str | None) -> datetime | None:
    """`parse_iso`, with None for a missing or unreadable time."""
    if not ts:
        return None
    try:
        return parse_iso(str(ts))
    except ValueError:
        return None


def seconds_between(start: object, end: object) -> float | None:
    """Seconds from one written time to another; None when either is missing or unreadable."""
    a, b = read_iso(str(start)), read_iso(str(end))
    return None if a is None or b is None else (b - a).total_seconds()


def in_hours(hours: float) -> str:
    """The written time `hours` from now."""
    return iso(datetime.now(UTC) + timedelta(hours=hours))
