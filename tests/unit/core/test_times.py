"""The fleet's one UTC day (`fleet.core.times`): where it starts and ends, and its name."""

from datetime import UTC, datetime, timedelta, timezone

from fleet.core.times import iso, next_utc_day_start, utc_day, utc_day_start

T = datetime(2026, 12, 3, 17, 4, 5, 123456, tzinfo=UTC)


def test_a_day_starts_and_ends_at_utc_midnight() -> None:
    assert utc_day_start(T) == datetime(2026, 12, 3, tzinfo=UTC)
    assert next_utc_day_start(T) == datetime(2026, 12, 4, tzinfo=UTC)
    assert utc_day_start(utc_day_start(T)) == utc_day_start(T)  # midnight starts its own day
    assert next_utc_day_start(datetime(2026, 12, 31, 23, 59, tzinfo=UTC)) == \
        datetime(2027, 1, 1, tzinfo=UTC)


def test_a_time_written_with_another_offset_is_in_its_utc_day() -> None:
    east = datetime(2026, 12, 4, 1, 30, tzinfo=timezone(timedelta(hours=2)))  # 23:30Z the 3rd
    assert utc_day_start(east) == datetime(2026, 12, 3, tzinfo=UTC)
    assert utc_day(east) == "2026-12-03"


def test_a_naive_time_is_read_as_utc() -> None:
    assert utc_day_start(T.replace(tzinfo=None)) == datetime(2026, 12, 3, tzinfo=UTC)


def test_a_day_is_named_as_its_written_times_begin() -> None:
    assert utc_day(T) == "2026-12-03" == iso(T)[:10]
    assert iso(utc_day_start(T)) == "2026-12-03T00:00:00Z"
