import multiprocessing
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fleet.boxes.sshkeys import ensure_key
from fleet.core.boxes import Row
from fleet.core.config import Config, Role
from fleet.core.errors import BudgetExceeded
from fleet.ops import budget, rent
from fleet.ops.budget import Projection, project, project_new, require_fits
from fleet.providers.base import Box, Offer, RentRequest, Unreadable
from fleet.state.registry import Registry

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
PRICE = 1.0  # $/h: $12 until that midnight, $24 a day (the run rate, the check that binds)


class _Provider:
    """A provider whose rent always lands at once (no HTTP)."""

    name = "vast"

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        return Box("vast", f"id-{req.label}", req.label, offer.card, offer.gpu_count,
                   offer.usd_per_hour, "provisioning")

    def find_by_label(self, label: str) -> Box | None:
        return None

    def box(self, box_id: str) -> Box | None:
        return None  # not listed yet: the offer's price stands

    def boxes(self) -> list[Box | Unreadable]:
        return []  # nothing else on the account


def _renter(cfg: Config, label: str, start: Any) -> None:
    """One `fleet rent` in its own process; exit 0 rented, 3 refused by the budget."""
    import fleet.ops.budget as b

    real = b.project

    def slow(rows: list[Row], budget_usd: float, new_usd_per_hour: float = 0.0,
             now: datetime | None = None, new_hours: float | None = None,
             billed: Any = None, unowned: Any = ()) -> Projection:
        time.sleep(0.3)  # a busy machine: the projection takes a while
        return real(rows, budget_usd, new_usd_per_hour, PAST_NOON, new_hours,  # exact figures
                    billed, unowned)

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
    budget = PRICE * 24 * (fit + 0.5)
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


# --- the run rate: a rent must fit a whole day of the fleet, whatever the time -------------

BEFORE_MIDNIGHT = datetime(2026, 12, 2, 23, 55, tzinfo=UTC)


def test_a_rent_just_before_midnight_must_fit_a_day_of_its_price() -> None:
    # $48 spent today; a $600/h box until midnight is $50 more: the day fits, but tomorrow
    # it alone would cost $14,400
    rows = [row("a", 48.0, "2026-12-02T10:00:00Z", "2026-12-02T11:00:00Z", "destroyed")]
    p = project_new(rows, budget_usd=100, new_usd_per_hour=600.0, now=BEFORE_MIDNIGHT)
    assert p.total_usd == pytest.approx(48 + 50) and p.fits_day
    assert p.run_rate_usd == pytest.approx(600 * 24) and not p.fits_rate and not p.fits
    with pytest.raises(BudgetExceeded) as e:
        require_fits(p, "renting a box")
    text = str(e.value)
    assert "\n" not in text and "run rate" in text and "$14400.00" in text
    assert "$100.00" in text and "projected day" not in text  # only the check that failed


def test_the_run_rate_counts_live_boxes_a_day_and_one_shots_until_their_ttl() -> None:
    rows = [row("a", 1.0, "2026-12-02T00:00:00Z"),  # $24 a day
            replace(row("j", 2.0, "2026-12-02T11:00:00Z"),
                    expires_at="2026-12-02T15:00:00Z"),  # 3 h left: $6
            replace(row("k", 3.0, "2026-12-02T08:00:00Z"),
                    expires_at="2026-12-02T11:00:00Z"),  # past its TTL, still billing: $72
            row("d", 50.0, "2026-12-02T01:00:00Z", "2026-12-02T02:00:00Z", "destroyed")]
    p = project_new(rows, budget_usd=150, new_usd_per_hour=4.0, now=NOON, new_hours=0.5)
    assert p.rate_usd == pytest.approx(24 + 6 + 72)
    assert p.new_rate_usd == pytest.approx(2.0)  # a one-shot rent: its TTL only
    assert p.fits  # the day: 76 spent, 54 until midnight, 2 for the job
    whole = project_new(rows, budget_usd=150, new_usd_per_hour=4.0, now=NOON)
    assert whole.new_rate_usd == pytest.approx(96.0) and not whole.fits_rate


def test_both_checks_failing_name_both() -> None:
    p = project([row("a", 3.0, "2026-12-02T00:00:00Z")], budget_usd=50, new_usd_per_hour=1.0,
                now=NOON)
    with pytest.raises(BudgetExceeded) as e:
        require_fits(p, "renting a box")
    assert "projected day $84.00" in str(e.value) and "run rate $96.00" in str(e.value)


def test_the_guard_refuses_by_the_run_rate(tmp_path: Path) -> None:
    from fleet.ops.budget import guard

    rows = [row("a", 48.0, "2026-12-02T10:00:00Z", "2026-12-02T11:00:00Z", "destroyed")]
    with pytest.raises(BudgetExceeded, match="run rate"):
        guard(100, 600.0, "renting", now=BEFORE_MIDNIGHT, account=())(rows)
    guard(100, 600.0, "renting", new_hours=5 / 60, now=BEFORE_MIDNIGHT,  # a 5-min job
          account=())(rows)


# --- the account: every box a provider lists counts, owned by the registry or not ----------

class _Account(_Provider):
    """A provider whose account lists `listing` beside the boxes it rented."""

    def __init__(self, listing: list[Box | Unreadable] | None = None) -> None:
        self.listing = list(listing or [])

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        box = super().rent(offer, req)
        self.listing.append(box)
        return box

    def boxes(self) -> list[Box | Unreadable]:
        return list(self.listing)


def _bench_cfg(tmp_path: Path, budget: float) -> Config:
    return Config(path=tmp_path / "fleet.toml", registry=tmp_path / "boxes.json",
                  known_hosts=tmp_path / "known_hosts", ssh_key=ensure_key(tmp_path / "key"),
                  releases=tmp_path / "releases", daily_budget_usd=budget,
                  roles={"bench": Role("bench", "oneshot", "img", 20)}, roster=())


def _listed(box_id: str, label: str, usd: float) -> Box:
    return Box("vast", box_id, label, "RTX 4090", 1, usd, "running")


def _rent(cfg: Config, p: _Provider, label: str, usd: float = 1.0) -> rent.RentOutcome:
    return rent.rent(cfg, Registry(cfg.registry), cfg.role("bench"),
                     [Offer("vast", "1", "RTX 4090", 1, usd)], {"vast": p},  # type: ignore[dict-item]
                     label=label)


def test_boxes_on_the_account_the_registry_does_not_own_count_in_the_run_rate(
        tmp_path: Path) -> None:
    # another registry's fleet on the same account: 4 boxes at $1/h, $96 a day of $100
    cfg = _bench_cfg(tmp_path, 100.0)
    p = _Account([_listed(str(i), f"bench-3fa9c1-vast-00000{i}", 1.0) for i in range(4)])
    with pytest.raises(BudgetExceeded) as e:
        _rent(cfg, p, "bench-a-1")  # $24 more a day
    text = str(e.value)
    assert "run rate $120.00" in text and "\n" not in text
    assert "$96.00 for 4 boxes on the account the registry does not own" in text
    assert Registry(cfg.registry).rows() == []  # nothing written, nothing rented


def test_a_box_both_in_the_registry_and_listed_counts_once(tmp_path: Path) -> None:
    # a person's $2/h box on the account ($48 a day); each rent $24 a day of $100
    cfg = _bench_cfg(tmp_path, 100.0)
    p = _Account([_listed("9", "bench-debug", 2.0)])
    _rent(cfg, p, "bench-a-1")  # 48 + 24: listed and in the registry from now on
    _rent(cfg, p, "bench-a-2")  # 48 + 24 + 24 = 96 fits: bench-a-1 counted once, not twice
    with pytest.raises(BudgetExceeded, match=r"run rate \$108\.00 .*\$48\.00 for 1 box on"):
        _rent(cfg, p, "bench-a-3", usd=0.5)
    assert [r.label for r in Registry(cfg.registry).rows()] == ["bench-a-1", "bench-a-2"]


def test_a_listing_that_fails_refuses_the_rent(tmp_path: Path) -> None:
    from fleet.core.errors import ProviderError

    class Blind(_Account):
        def boxes(self) -> list[Box | Unreadable]:
            raise ProviderError("vast", "list instances", "HTTP 503")

    cfg = _bench_cfg(tmp_path, 100.0)
    with pytest.raises(BudgetExceeded) as e:
        _rent(cfg, Blind(), "bench-a-1")
    assert "vast's listing of the account failed" in str(e.value) and "HTTP 503" in str(e.value)
    assert Registry(cfg.registry).rows() == []


def test_a_listed_box_whose_price_cannot_be_read_refuses_the_rent(tmp_path: Path) -> None:
    cfg = _bench_cfg(tmp_path, 100.0)
    odd = Unreadable("vast", "77", "web1", "no HostPort in its port binding")
    with pytest.raises(BudgetExceeded, match="price cannot be read: web1 .vast/77.") as e:
        _rent(cfg, _Account([odd]), "bench-a-1")
    assert "\n" not in str(e.value) and Registry(cfg.registry).rows() == []


def test_an_unfinished_row_owns_one_box_under_its_label_and_a_second_counts() -> None:
    from fleet.ops.budget import unowned_boxes

    waiting = replace(row("bench-a-1", 1.0, "2026-12-02T11:00:00Z", status="renting"))
    named = replace(row("bench-a-2", 1.0, "2026-12-02T11:00:00Z"), provider_id="5")
    gone = replace(row("bench-a-3", 1.0, "2026-12-02T09:00:00Z", "2026-12-02T10:00:00Z",
                       "destroyed"), provider_id="6")
    first, second = _listed("3", "bench-a-1", 1.0), _listed("4", "bench-a-1", 1.0)
    mine, still = _listed("5", "bench-a-2", 1.0), _listed("6", "bench-a-3", 1.0)
    odd = Unreadable("vast", "5", None, "odd")  # may be bench-a-2's: its row counts it
    assert unowned_boxes([waiting, named, gone], [first, second, mine, still, odd], "x") == \
        [second, still]  # a destroyed row's box that is still listed bills


def test_an_unreadable_listing_row_counts_at_its_price_where_that_still_reads() -> None:
    from fleet.ops.budget import unowned_boxes

    mine = replace(row("bench-a-1", 1.0, "2026-12-02T11:00:00Z"), provider_id="5")
    priced = Unreadable("vast", "9", None, "no HostPort in its port binding", 3.9)
    same_label = Unreadable("vast", "8", "bench-a-1", "odd", 2.0)  # another id: not its box
    unread_id = Unreadable("vast", None, "bench-a-1", "odd")  # may be its box: its row counts it
    counted = unowned_boxes([mine], [priced, same_label, unread_id], "x")
    assert [(b.box_id, b.usd_per_hour) for b in counted] == [("9", 3.9), ("8", 2.0)]
    with pytest.raises(BudgetExceeded, match="price cannot be read"):
        unowned_boxes([mine], [Unreadable("vast", "7", "bench-a-1", "odd")], "x")


def test_the_boxes_prices_sum_to_an_hour_and_a_day_of_them() -> None:
    cost = budget.rate([0.398, 0.44, 1.2])
    assert cost.usd_per_hour == pytest.approx(2.038)
    assert cost.usd_per_day == pytest.approx(2.038 * 24)
    assert budget.rate([]) == budget.Rate(0.0) and budget.rate(iter([0.5])).usd_per_day == 12.0
