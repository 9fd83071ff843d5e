"""The listing matched against the registry where listing rows are unreadable: each live row
the listing left out is unsure when an unreadable row may be its box (the same id, or, where an
id is unknown, the same label or none), the first such row in the listing's order; and a
listing of thousands of unreadable rows is read once, not once per registry row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fleet.core.boxes import Row
from fleet.providers.base import Box, Unreadable
from fleet.providers.sync import view
from fleet.state.registry import Registry


class Listing:
    name = "vast"

    def __init__(self, listed: list[Any]) -> None:
        self.listed = listed
        self.asked: list[str] = []

    def boxes(self) -> list[Any]:
        return list(self.listed)

    def box(self, box_id: str) -> Box | None:
        self.asked.append(box_id)
        return None


def registry(tmp_path: Path, rows: list[tuple[str, str | None]]) -> Registry:
    reg = Registry(tmp_path / "boxes.json")
    with reg.transaction() as held:
        for label, box_id in rows:
            held[label] = Row(label=label, provider="vast", role="live", kind="standing",
                              card="RTX 4090", gpu_count=1, usd_per_hour=0.3, status="running",
                              provider_id=box_id)
    return reg


def test_an_unreadable_row_makes_unsure_the_rows_it_may_be_the_first_in_listing_order(
        tmp_path: Path) -> None:
    reg = registry(tmp_path, [("by-id", "1"), ("other-id", "2"), ("no-id", None),
                              ("by-label", "3"), ("unmatched", "4"), ("unread", None)])
    odd = [Unreadable("vast", "1", "renamed", "KeyError: 'HostPort'"),
           Unreadable("vast", "9", "other-id", "id 9: not row other-id's box 2"),
           Unreadable("vast", "5", "no-id", "first for no-id"),
           Unreadable("vast", None, "no-id", "second for no-id"),
           Unreadable("vast", None, "by-label", "no id, its label"),
           Unreadable("vast", None, "unread", "no id, unread's label")]
    p = Listing([*odd, Box("vast", "4", "unmatched", "RTX 4090", 1, 0.3, "running")])
    v = view(reg, {"vast": p})
    assert v.unsure == {"by-id": str(odd[0]), "no-id": str(odd[2]),
                        "by-label": str(odd[4]), "unread": str(odd[5])}
    assert p.asked == ["2"] and v.gone[0].label == "other-id"  # no unreadable row may be it
    assert [r.label for r, _ in v.matched] == ["unmatched"]


def test_an_unreadable_row_with_neither_id_nor_label_may_be_any_box(tmp_path: Path) -> None:
    reg = registry(tmp_path, [("a", "1"), ("b", None)])
    blank = Unreadable("vast", None, None, "nothing reads")
    v = view(reg, {"vast": Listing([blank])})
    assert v.unsure == {"a": str(blank), "b": str(blank)} and not v.gone


class Counted(Unreadable):
    """An unreadable row that counts how often its id is read."""

    reads = 0

    def __getattribute__(self, name: str) -> Any:
        if name == "box_id":
            Counted.reads += 1
        return super().__getattribute__(name)


def test_thousands_of_unreadable_rows_are_each_read_a_few_times_not_once_per_row(
        tmp_path: Path) -> None:
    # a listing format the client no longer reads: every row of the listing is unreadable
    n = 2000
    reg = registry(tmp_path, [(f"live-vast-{i:04d}", str(i)) for i in range(n)])
    odd = [Counted("vast", str(i), f"live-vast-{i:04d}", "KeyError: 'HostPort'")
           for i in range(n)]
    said = {u.label: str(u) for u in odd}
    Counted.reads = 0
    v = view(reg, {"vast": Listing(odd)})
    assert Counted.reads <= 4 * n  # indexed, and named in the row's message: not n * n / 2
    assert v.unsure == said
