"""`fleet.ops.sweep`: which boxes on the account are orphans and whether any may be swept,
from plain boxes and rows (no provider or file)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from fleet.core import labels
from fleet.core.boxes import Row
from fleet.ops import sweep
from fleet.providers.base import Box

FORM = labels.fleet_form(("live",), "f00d")
MINE, OTHER = "live-f00d-vast-0a0a0a", "live-beef-vast-0b0b0b"


def box(label: str, box_id: str = "9") -> Box:
    return Box("vast", box_id, label, "RTX 4090", 1, 0.3, "running")


def row(label: str, **kw: Any) -> Row:
    fields: dict[str, Any] = {"status": "running", "provider_id": "1"} | kw
    return Row(label=label, provider="vast", role="live", kind="standing", card="RTX 4090",
               gpu_count=1, usd_per_hour=0.3, **fields)


def found(boxes: list[Box], rows: list[Row], duplicates: Collection[str] = (),
          adopted: Collection[str] = ()) -> list[tuple[str, str, bool]]:
    return [(o.box.label, o.what, o.ours)
            for o in sweep.orphans(boxes, rows, FORM, ("live",), duplicates, adopted)]


def test_only_boxes_under_the_fleets_roles_are_orphans_and_only_its_own_form_is_swept() -> None:
    rows = [row("live-f00d-vast-111111")]
    assert found([box(MINE), box(OTHER), box("live-web1"), box("db-1"), box("")], rows) == [
        (MINE, "not in the registry", True),
        (OTHER, "not in the registry", False),  # another fleet id: never ours to sweep
        ("live-web1", "not in the registry", False)]  # a person's name under our role


def test_a_second_box_under_a_live_label_and_a_box_under_a_given_up_label_are_orphans() -> None:
    rows = [row(MINE), row("web1", status="destroyed")]
    assert found([box(MINE, "7"), box("web1")], rows, duplicates={"vast/7"}) == [
        (MINE, "a second box under a live label", True),
        ("web1", "its rent was given up or its box destroyed", False)]


def test_a_box_adopted_this_tick_is_no_orphan() -> None:
    assert found([box(MINE)], [row("live-f00d-vast-111111")], adopted={"vast/9"}) == []


def test_the_sweep_refuses_on_an_empty_registry_more_orphans_than_rows_or_an_unrecorded_rent(
        ) -> None:
    live = row("live-f00d-vast-111111")
    given_up = row(MINE, status="vanished")
    one = sweep.orphans([box(MINE)], [live, given_up], FORM, ("live",), set(), set())
    assert sweep.refusal(one, [live, given_up]) is None
    assert "no live box" in (sweep.refusal(one, [given_up]) or "")
    unrecorded = sweep.orphans([box(MINE)], [live], FORM, ("live",), set(), set())
    assert "never recorded a rent of " + MINE in (sweep.refusal(unrecorded, [live]) or "")
    two = sweep.orphans([box(MINE, "1"), box("live-f00d-vast-222222", "2")],
                        [live, given_up, row("live-f00d-vast-222222", status="failed")],
                        FORM, ("live",), set(), set())
    assert "2 orphans outnumber the registry's 1 live boxes" == sweep.refusal(
        two, [live, given_up, row("live-f00d-vast-222222", status="failed")])


def test_orphans_not_of_the_fleets_form_never_count_against_the_sweep() -> None:
    live = row("live-f00d-vast-111111")
    found_ = sweep.orphans([box(OTHER, "1"), box("live-web2", "2")], [live], FORM, ("live",),
                           set(), set())
    assert [o.ours for o in found_] == [False, False]
    assert sweep.refusal(found_, [live]) is None
