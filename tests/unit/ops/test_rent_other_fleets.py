"""The rent's refusal beside another fleet's boxes (`rent.other_fleets`) names only boxes
that are provably another fleet's: a box this registry's fleet made, listed while the
registry still read empty (a second `fleet rent` of the same fleet at the same moment), is
its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.core.errors import UsageError
from fleet.core.labels import new_label
from fleet.core.states import BoxStatus
from fleet.ops import rent
from fleet.providers.base import Box
from fleet.state.registry import Registry


class Listing:
    """A provider whose listing shows `boxes()` at the moment it is asked."""

    def __init__(self, boxes: object) -> None:
        self._boxes = boxes

    def boxes(self) -> list[Box]:
        return self._boxes()  # type: ignore[operator, no-any-return]


def _box(label: str) -> Box:
    return Box("vast", "20729558", label, "RTX 4090", 1, 0.3, BoxStatus.PROVISIONING)


def test_a_box_this_fleet_rented_while_the_registry_read_empty_is_not_another_fleets(
        tmp_path: Path) -> None:
    reg = Registry(tmp_path / "state" / "boxes.json")

    def rented_meanwhile() -> list[Box]:
        # the other `fleet rent`: its fleet id written, its box created, after our first read
        return [_box(new_label("live", "vast", reg.fleet_id()))]

    rent.other_fleets(reg, {"vast": Listing(rented_meanwhile)})  # type: ignore[dict-item]


def test_an_empty_registry_beside_another_fleets_box_is_refused(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "state" / "boxes.json")
    theirs = _box(new_label("live", "vast", "aad837"))
    with pytest.raises(UsageError, match="of another fleet"):
        rent.other_fleets(reg, {"vast": Listing(lambda: [theirs])})  # type: ignore[dict-item]
    assert reg.rows() == []
