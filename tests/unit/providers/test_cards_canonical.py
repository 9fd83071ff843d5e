"""`cards.canonical`: any spelling an operator may write for a card (the fleet's name, RunPod's
gpuTypeId, RunPod's display name; any case, extra spaces) is the fleet's one name for it."""

from __future__ import annotations

import pytest

from fleet.core import cards


@pytest.mark.parametrize("spelling", [
    "RTX 4090", "rtx 4090", "  RTX   4090 ", "NVIDIA GeForce RTX 4090",
    "nvidia geforce rtx 4090", "NVIDIA  GeForce\tRTX 4090",
])
def test_every_spelling_of_a_card_is_its_fleet_name(spelling: str) -> None:
    assert cards.canonical(spelling) == "RTX 4090"


@pytest.mark.parametrize(("spelling", "fleet"), [
    ("RTX 6000 Ada", "RTX 6000Ada"),  # RunPod's display name differs from the fleet's
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000Ada"),
    ("A100 SXM", "A100 SXM4"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4"),
    ("a100 pcie", "A100 PCIE"),
    ("H200 SXM", "H200"),
    ("h100 sxm", "H100 SXM"),
])
def test_runpod_names_map_to_the_fleet_name(spelling: str, fleet: str) -> None:
    assert cards.canonical(spelling) == fleet


@pytest.mark.parametrize("spelling", ["", "  ", "RTX 9999", "RTX4090", "NVIDIA Future 9000"])
def test_an_unknown_card_is_none(spelling: str) -> None:
    assert cards.canonical(spelling) is None


def test_every_card_is_its_own_canonical_name_and_no_spelling_names_two_cards() -> None:
    seen: dict[str, str] = {}
    for c in cards.CARDS:
        assert cards.canonical(c.fleet) == c.fleet
        for name in (c.fleet, c.runpod_id, c.runpod_display):
            key = " ".join(name.split()).lower()
            assert seen.setdefault(key, c.fleet) == c.fleet, f"{name!r} names two cards"


def test_known_lists_the_fleet_names_on_one_line() -> None:
    known = cards.known()
    assert "\n" not in known
    for c in cards.CARDS:
        assert c.fleet in known
