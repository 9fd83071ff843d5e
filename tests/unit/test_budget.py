from datetime import UTC, datetime

import pytest

from fleet.budget import project, require_fits
from fleet.errors import BudgetExceeded
from fleet.registry import Row

NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def row(label: str, usd: float, created: str, destroyed: str | None = None,
        status: str = "running") -> Row:
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=usd, status=status, created_at=created,
               destroyed_at=destroyed)


def test_projection_counts_spent_committed_and_new() -> None:
    rows = [
        row("a", 1.0, "2026-12-01T00:00:00Z"),  # live since yesterday: 12 h today so far
        row("b", 2.0, "2026-12-02T10:00:00Z", "2026-12-02T11:00:00Z", "destroyed"),  # 1 h
        row("c", 5.0, "2026-12-02T09:00:00Z", status="failed"),  # never billed
    ]
    p = project(rows, budget_usd=100, new_usd_per_hour=0.5, now=NOON)
    assert p.spent_usd == pytest.approx(12.0 + 2.0)
    assert p.committed_usd == pytest.approx(12.0)  # a, until midnight
    assert p.new_usd == pytest.approx(6.0)
    assert p.total_usd == pytest.approx(32.0) and p.fits


def test_refusal_names_the_figures() -> None:
    p = project([row("a", 3.0, "2026-12-02T00:00:00Z")], budget_usd=50, new_usd_per_hour=1.0,
                now=NOON)
    assert not p.fits  # 36 + 36 + 12 = 84 > 50
    with pytest.raises(BudgetExceeded) as e:
        require_fits(p, "renting a box")
    assert "$84.00" in str(e.value) and "$50.00" in str(e.value)
