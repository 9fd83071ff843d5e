"""The price a rent is checked at is the price the provider will bill: Vast prices its offers
for the disk the search names, so the search names the disk the rent asks for; and once the
box exists, the price its provider lists for it is checked against the budget again (a box
that no longer fits is destroyed, its row says why)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from fleet.boxes import lifecycle
from fleet.boxes.sshkeys import ensure_key
from fleet.core.config import Config, Role
from fleet.core.errors import BudgetExceeded
from fleet.ops import offers as offers_mod
from fleet.ops import rent
from fleet.providers.base import Box, Offer, RentRequest
from fleet.providers.factory import get_provider
from fleet.providers.http import RetryPolicy
from fleet.state.registry import Registry
from sandbox.daemon import Sandbox
from sandbox.frozen import frozen_sandbox


def make_cfg(tmp_path: Path, budget: float, disk_gb: int = 20) -> Config:
    return Config(path=tmp_path / "fleet.toml", registry=tmp_path / "boxes.json",
                  known_hosts=tmp_path / "known_hosts", ssh_key=ensure_key(tmp_path / "key"),
                  releases=tmp_path / "releases", daily_budget_usd=budget,
                  roles={"bench": Role("bench", "oneshot", "img", disk_gb,
                                       admitted_driver="580.95.05")}, roster=())


class Listing:
    """A provider whose boxes are listed at `listed` USD/h, whatever the offer said."""

    name = "vast"

    def __init__(self, listed: float) -> None:
        self.listed = listed
        self.made: dict[str, Box] = {}
        self.destroyed: list[str] = []

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        box = Box("vast", str(100 + len(self.made)), req.label, offer.card, offer.gpu_count,
                  offer.usd_per_hour, "provisioning")
        self.made[box.box_id] = box
        return box

    def box(self, box_id: str) -> Box | None:
        b = self.made.get(box_id)
        return None if b is None else replace(b, usd_per_hour=self.listed)

    def find_by_label(self, label: str) -> Box | None:
        return next((b for b in self.made.values() if b.label == label), None)

    def boxes(self) -> list[Box]:
        return [replace(b, usd_per_hour=self.listed) for b in self.made.values()]

    def destroy(self, box_id: str) -> None:
        self.destroyed.append(box_id)
        self.made.pop(box_id, None)


OFFER = Offer("vast", "1", "RTX 4090", 1, 1.0)  # $24 a day: fits $100


def test_a_box_listed_over_the_budget_is_destroyed_and_its_row_says_why(tmp_path: Path) -> None:
    cfg, p = make_cfg(tmp_path, 100.0), Listing(10.0)  # listed: $240 a day
    reg = Registry(cfg.registry)
    with pytest.raises(BudgetExceeded) as e:
        rent.rent(cfg, reg, cfg.role("bench"), [OFFER, replace(OFFER, offer_id="2")],
                  {"vast": p}, label="bench-l-1")  # type: ignore[dict-item]
    assert "listed" in str(e.value) and "$10.000/h" in str(e.value)
    assert p.destroyed == ["100"] and p.made == {}
    (row,) = reg.rows()  # no second offer was tried
    assert row.status == "destroyed" and row.destroyed_at and row.provider_id == "100"
    assert row.usd_per_hour == 10.0 and "over budget at the listed price" in (row.note or "")


def test_a_box_listed_higher_that_still_fits_records_the_listed_price(tmp_path: Path) -> None:
    cfg, p = make_cfg(tmp_path, 100.0), Listing(2.0)  # $48 a day
    reg = Registry(cfg.registry)
    out = rent.rent(cfg, reg, cfg.role("bench"), [OFFER], {"vast": p},  # type: ignore[dict-item]
                    label="bench-l-2")
    assert p.destroyed == [] and out.row.usd_per_hour == 2.0
    (row,) = reg.rows()
    assert row.live and row.usd_per_hour == 2.0 and row.provider_id == "100"


def test_a_box_over_budget_whose_destroy_fails_is_wanted_destroyed_and_never_adopted(
        tmp_path: Path) -> None:
    from fleet.core.boxes import unfinished
    from fleet.core.errors import ProviderError

    class Stuck(Listing):
        def destroy(self, box_id: str) -> None:
            raise ProviderError("vast", "destroy", f"box {box_id} is still listed 120 s after")

    cfg, p = make_cfg(tmp_path, 100.0), Stuck(10.0)
    reg = Registry(cfg.registry)
    with pytest.raises(ProviderError):
        rent.rent(cfg, reg, cfg.role("bench"), [OFFER], {"vast": p},  # type: ignore[dict-item]
                  label="bench-l-3")
    (row,) = reg.rows()  # the budget counts it; never resumed, converted or in the roster
    assert row.live and row.destroy_wanted and not unfinished(row)
    assert "may still bill" in (row.note or "")


def test_a_listing_without_a_price_never_makes_a_live_box_cheaper(tmp_path: Path) -> None:
    cfg, p = make_cfg(tmp_path, 10.0), Listing(0.0)  # $10 a day: one $0.3/h box fits, not two
    reg = Registry(cfg.registry)
    offer = replace(OFFER, usd_per_hour=0.3)
    rent.rent(cfg, reg, cfg.role("bench"), [offer], {"vast": p},  # type: ignore[dict-item]
              label="bench-l-4")
    row = reg.get("bench-l-4")
    assert row is not None
    lifecycle.record(reg, row.label, replace(p.made["100"], usd_per_hour=0.0))
    assert reg.get("bench-l-4").usd_per_hour == 0.3  # type: ignore[union-attr]
    with pytest.raises(BudgetExceeded):
        rent.rent(cfg, reg, cfg.role("bench"), [offer], {"vast": p},  # type: ignore[dict-item]
                  label="bench-l-5")


class Asked:
    def __init__(self, name: str) -> None:
        self.name = name
        self.kw: dict[str, Any] = {}

    def offers(self, **kw: Any) -> list[Offer]:
        self.kw = kw
        return []


def test_the_search_names_the_disk_the_rent_asks_for(tmp_path: Path) -> None:
    role = Role("bench", "oneshot", "img", 40)
    vast, runpod = Asked("vast"), Asked("runpod")
    offers_mod.search(role, [vast, runpod])  # type: ignore[list-item]
    for p in (vast, runpod):
        req = rent.request_for(make_cfg(tmp_path, 1.0, 40), role, "bench-x", p.name)
        assert p.kw["disk_gb"] == req.disk_gb + req.volume_gb
    assert vast.kw["disk_gb"] == 40


@pytest.fixture
def sbx(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sandbox]:
    with frozen_sandbox(seed=7) as s:
        for k, v in s.env().items():
            monkeypatch.setenv(k, v)
        yield s


def test_vast_offers_searched_for_the_disk_are_priced_as_the_box_is_listed(
        sbx: Sandbox) -> None:
    p = get_provider("vast", retry=RetryPolicy(attempts=2), sleep=lambda s: None)
    small = min(p.offers(), key=lambda o: o.offer_id)
    big = next(o for o in p.offers(disk_gb=200) if o.offer_id == small.offer_id)
    assert big.usd_per_hour > small.usd_per_hour  # Vast's dph_total counts the disk
    box = p.rent(big, RentRequest(label="disk-200", image="img", disk_gb=200))
    listed = p.box(box.box_id)
    assert listed is not None and listed.usd_per_hour == pytest.approx(big.usd_per_hour)


def test_a_rent_on_vast_records_what_vast_lists(sbx: Sandbox, tmp_path: Path) -> None:
    cfg = make_cfg(tmp_path, 1000.0, disk_gb=200)
    p = get_provider("vast", retry=RetryPolicy(attempts=2), sleep=lambda s: None)
    found, failures = offers_mod.search(cfg.role("bench"), [p])
    assert found and not failures
    out = rent.rent(cfg, Registry(cfg.registry), cfg.role("bench"), found[:1], {"vast": p},
                    label="bench-l-3")
    listed = p.box(out.row.provider_id or "")
    assert listed is not None
    assert out.row.usd_per_hour == pytest.approx(listed.usd_per_hour)
    assert out.row.usd_per_hour == pytest.approx(found[0].usd_per_hour)
