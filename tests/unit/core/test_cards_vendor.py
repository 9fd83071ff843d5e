"""The card table names each card's vendor, and reads AMD cards in the spellings the providers
and operators use."""

import pytest

from fleet.core import cards


@pytest.mark.parametrize(("spelling", "fleet_name"), [
    ("RX 7900 XTX", "RX 7900 XTX"), ("AMD Radeon RX 7900 XTX", "RX 7900 XTX"),
    ("radeon rx 7900 xtx", "RX 7900 XTX"), ("Radeon PRO W7900", "PRO W7900"),
    ("AMD Radeon PRO W7900", "PRO W7900"), ("MI210", "MI210"), ("Instinct MI250X", "MI250X"),
    ("AMD Instinct MI300X OAM", "MI300X"), ("mi300x", "MI300X"),
])
def test_amd_cards_are_read_in_every_spelling(spelling: str, fleet_name: str) -> None:
    assert cards.canonical(spelling) == fleet_name
    assert cards.vendor(spelling) == cards.AMD


@pytest.mark.parametrize("name", ["RTX 4090", "RTX 4070", "RTX 3080", "RTX A5000", "L4",
                                  "RTX 5090", "NVIDIA GeForce RTX 3090"])
def test_nvidia_cards_are_nvidia(name: str) -> None:
    assert cards.vendor(name) == cards.NVIDIA


def test_an_unknown_card_has_no_vendor() -> None:
    assert cards.vendor("Voodoo 5 6000") is None
