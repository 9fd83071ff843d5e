import multiprocessing
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleet import rent
from fleet.budget import Projection, project, project_new, require_fits
from fleet.config import Config, Role
from fleet.errors import BudgetExceeded
from fleet.providers.base import Box, Offer, RentRequest
from fleet.registry import Registry, Row
from fleet.sshkeys import ensure_key

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


def test_a_replaced_row_counts_until_now_but_not_beside_its_replacement() -> None:
    rows = [row("a", 1.0, "2026-12-02T10:00:00Z", status="renting"),  # 2 h so far
            row("b", 1.0, "2026-12-02T00:00:00Z")]  # 12 h so far, 12 h to come
    p = project_new(rows, budget_usd=100, new_usd_per_hour=2.0, replacing="a", now=NOON)
    assert p.spent_usd == pytest.approx(2.0 + 12.0)
    assert p.committed_usd == pytest.approx(12.0)  # b only: a's place is the new box's
    assert p.new_usd == pytest.approx(24.0)
    plain = project_new(rows, budget_usd=100, new_usd_per_hour=2.0, now=NOON)
    assert plain.committed_usd == pytest.approx(24.0)


# --- concurrent rents: the check and the row are one locked step ---------------------------

PAST_NOON = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)  # 12 h to midnight; every row is younger
PRICE = 1.0  # $/h: $12 until that midnight


class _Provider:
    """A provider whose rent always lands at once (no HTTP)."""

    name = "vast"

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        return Box("vast", f"id-{req.label}", req.label, offer.card, offer.gpu_count,
                   offer.usd_per_hour, "provisioning")

    def find_by_label(self, label: str) -> Box | None:
        return None


def _renter(cfg: Config, label: str, start: Any) -> None:
    """One `fleet rent` in its own process; exit 0 rented, 3 refused by the budget."""
    import fleet.budget as b

    real = b.project

    def slow(rows: list[Row], budget_usd: float, new_usd_per_hour: float = 0.0,
             now: datetime | None = None, new_hours: float | None = None,
             billed: Any = None) -> Projection:
        time.sleep(0.3)  # a busy machine: the projection takes a while
        return real(rows, budget_usd, new_usd_per_hour, PAST_NOON, new_hours,  # exact figures
                    billed)

    b.project = slow  # type: ignore[assignment]
    role = cfg.role("bench")
    start.wait(30)
    try:
        rent.rent(cfg, Registry(cfg.registry), role, [Offer("vast", "1", "RTX 4090", 1, PRICE)],
                  {"vast": _Provider()}, label=label)  # type: ignore[dict-item]
    except BudgetExceeded:
        sys.exit(3)


@pytest.mark.parametrize("fit", [1, 2])
def test_concurrent_rents_never_pass_the_budget_together(tmp_path: Path, fit: int) -> None:
    # each box alone fits; `fit` of them fit together, one more does not
    budget = PRICE * 12 * (fit + 0.5)
    cfg = Config(path=tmp_path / "fleet.toml", registry=tmp_path / "boxes.json",
                 known_hosts=tmp_path / "known_hosts", ssh_key=ensure_key(tmp_path / "key"),
                 releases=tmp_path / "releases", daily_budget_usd=budget,
                 roles={"bench": Role("bench", "oneshot", "img", 20)}, roster=())
    n = 6
    ctx = multiprocessing.get_context("fork")
    start = ctx.Barrier(n)
    procs = [ctx.Process(target=_renter, args=(cfg, f"bench-c-{i}", start)) for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode is not None, "a renter hung"
    assert sorted(p.exitcode for p in procs) == [0] * fit + [3] * (n - fit)
    rows = Registry(cfg.registry).rows()
    assert len(rows) == fit and all(r.provider_id == f"id-{r.label}" for r in rows)
    assert project(rows, budget, PRICE, now=PAST_NOON).fits is False  # full: one more is over
