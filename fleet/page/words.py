"""How the page words times and ages, in its data's note and in its HTML alike."""

from __future__ import annotations

from datetime import UTC, datetime

from fleet.core.times import read_iso, utc_day


def day_time(ts: str, now: datetime | None = None) -> str:
    """`2026-12-04 17:03 UTC`, or `17:03 UTC` on `now`'s own UTC day."""
    t = read_iso(ts)
    if t is None:
        return "an unknown time"
    t = t.astimezone(UTC)  # a time written with another offset is named in UTC
    return f"{t:%H:%M} UTC" if now is not None and utc_day(t) == utc_day(now) else \
        f"{t:%Y-%m-%d %H:%M} UTC"


def duration(seconds: float) -> str:
    """A length of time in words: `40 s`, `12 min`, `3.5 h`, `2.0 days`."""
    s = abs(seconds)
    return (f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 90 * 60
            else f"{s / 3600:.1f} h" if s < 48 * 3600 else f"{s / 86400:.1f} days")


def age_words(seconds: float) -> str:
    """An age in words: `12 min old`, or `12 min ahead of this clock` for a time to come."""
    return f"{duration(seconds)} {'old' if seconds >= 0 else 'ahead of this clock'}"
