"""Spent today from the providers' bills: a bill replaces the estimate (and so can refuse a
rent the estimate would let through); a stale bill, a failed provider or a box the bill does
not name falls back to the estimate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from fleet import bills, budget
from fleet.errors import BudgetExceeded, ProviderError
from fleet.registry import Row

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def row(label: str, box_id: str, usd_h: float = 0.5) -> Row:
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=usd_h, status="running", provider_id=box_id,
               created_at="2026-12-03T00:00:00Z")


class Billing:
    name = "vast"

    def __init__(self, charged: dict[str, float] | None) -> None:
        self.charged = charged
        self.asked: list[tuple[datetime, datetime]] = []

    def charges(self, since: datetime, until: datetime) -> dict[str, float]:
        self.asked.append((since, until))
        if self.charged is None:
            raise ProviderError("vast", "GET /api/v0/charges/", "HTTP 503")
        return self.charged


def test_a_bill_replaces_the_estimate_and_the_time_since_it_is_added(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    p = Billing({"1": 9.0})
    bills.refresh(reg, {"vast": p, "runpod": object()}, NOW)  # RunPod reports no bills
    assert p.asked == [(NOW.replace(hour=0), NOW)]
    rows = [row("billed", "1"), row("unnamed", "2")]
    later = NOW + timedelta(minutes=6)
    spent = bills.billed(rows, bills.load(reg), later)
    assert spent == {"billed": pytest.approx(9.0 + 0.5 * 0.1)}  # + 6 minutes at $0.5/h
    day = budget.project(rows, 100, now=later, billed=spent)
    assert day.spent_usd == pytest.approx(9.05 + 0.5 * 12.1)  # the unnamed box: estimated


def test_a_stale_bill_or_a_failed_provider_is_estimated(tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    bills.refresh(reg, {"vast": Billing({"1": 9.0})}, NOW)
    assert bills.billed([row("b", "1")], bills.load(reg),
                        NOW + timedelta(seconds=bills.MAX_AGE_S + 1)) == {}
    failed = bills.refresh(reg, {"vast": Billing(None)}, NOW)
    assert "HTTP 503" in failed.errors["vast"]
    assert bills.billed([row("b", "1")], bills.load(reg), NOW) == {}
    (tmp_path / "bills.json").write_text("{broken")
    assert bills.load(reg) is None


def test_a_bill_larger_than_the_estimate_refuses_a_rent_the_estimate_allows(
        tmp_path: Path) -> None:
    reg = tmp_path / "boxes.json"
    rows = [row("b", "1")]  # $0.5/h all day: $12 spent and committed, whatever the hour
    check = budget.guard(20, 0.1, "renting a box", bills=None)
    check(rows)  # the estimate: 12 + at most 2.4 for the new box fits in 20
    bills.refresh(reg, {"vast": Billing({"1": 40.0})}, datetime.now(UTC))
    with pytest.raises(BudgetExceeded, match="would pass the daily budget"):
        budget.guard(20, 0.1, "renting a box", bills=bills.load(reg))(rows)
