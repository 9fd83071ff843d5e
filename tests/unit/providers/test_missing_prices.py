"""A price the provider leaves out is unknown, never $0: an offer without one is not rented,
and a listed box without one is not counted as free by the budget."""

from __future__ import annotations

import pytest
from provider_fakes import FakeRunPod, FakeVast

from fleet.core.config import Role
from fleet.core.errors import BudgetExceeded
from fleet.ops import budget, offers
from fleet.providers.runpod import RunPod
from fleet.providers.vast import Vast

ROLE = Role("bench", "standing", "img", 20)  # runs no GPU program: any driver will do


def test_a_vast_offer_without_a_price_is_not_offered_and_is_named(
        vast: tuple[Vast, FakeVast]) -> None:
    client, fake = vast
    like = {k: v for k, v in fake.offers[0].items() if k != "dph_total"}
    fake.offers += [like | {"id": 503}, like | {"id": 504, "dph_total": None},
                    like | {"id": 505, "dph_total": "n/a"}]
    got = client.offers()
    assert [(o.offer_id, o.usd_per_hour) for o in got] == [("501", 0.41), ("502", 0.38)]
    assert getattr(got, "unpriced", None) == ("503", "504", "505")


def test_a_runpod_type_in_stock_without_a_price_is_not_offered_and_is_named(
        rp: tuple[RunPod, FakeRunPod]) -> None:
    client, fake = rp
    fake.gpu_types[0]["lowestPrice"]["uninterruptablePrice"] = None  # RTX 4090, in stock
    got = client.offers()
    assert list(got) == []  # the H100 has no stock: not offered, and not a missing price
    assert getattr(got, "unpriced", None) == ("NVIDIA GeForce RTX 4090:SECURE",
                                              "NVIDIA GeForce RTX 4090:COMMUNITY")


def test_a_search_says_the_offers_it_skipped_for_no_price(
        vast: tuple[Vast, FakeVast]) -> None:
    client, fake = vast
    fake.offers.append({k: v for k, v in fake.offers[0].items() if k != "dph_total"}
                       | {"id": 503})
    found, said = offers.search(ROLE, [client])
    assert [o.offer_id for o in found] == ["502", "501"]
    assert len(said) == 1 and "\n" not in str(said[0])
    assert "503" in str(said[0]) and "no price" in str(said[0])


def _listed_without_a_price(name: str, vast: tuple[Vast, FakeVast],
                            rp: tuple[RunPod, FakeRunPod]) -> list[object]:
    if name == "vast":
        client, fake = vast
        fake.instances[fake.add("web1")].pop("dph_total")  # a person's box, no price listed
        return list(client.boxes())
    rclient, rfake = rp
    rfake.pods[rfake.add("web1")].pop("costPerHr")
    return list(rclient.boxes())


@pytest.mark.parametrize("name", ["vast", "runpod"])
def test_a_listed_box_without_a_price_refuses_a_rent_in_one_line(
        name: str, vast: tuple[Vast, FakeVast], rp: tuple[RunPod, FakeRunPod]) -> None:
    listing = _listed_without_a_price(name, vast, rp)
    with pytest.raises(BudgetExceeded) as e:
        budget.unowned_boxes([], listing, "renting a box")  # type: ignore[arg-type]
    text = str(e.value)
    assert "\n" not in text and text.startswith("renting a box refused: price of box web1")
    assert "unknown" in text


def test_a_runpod_pod_without_cost_per_hour_counts_at_its_adjusted_cost(
        rp: tuple[RunPod, FakeRunPod]) -> None:
    client, fake = rp
    pod = fake.pods[fake.add("web1")]
    pod.pop("costPerHr")
    pod["adjustedCostPerHr"] = 0.55
    (box,) = budget.unowned_boxes([], client.boxes(), "renting a box")
    assert box.label == "web1" and box.usd_per_hour == 0.55
