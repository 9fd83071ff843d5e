"""`fleet.ops.destroy`: the one destroy path, its guards in their order, and that every destroy
in the fleet's code goes through it.

The provider side is the sandbox's fake APIs over real HTTP (see cli_sandbox).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from cli_sandbox import FleetRun
from repo_root import ROOT

from fleet.core.boxes import Row
from fleet.core.config import load as load_config
from fleet.core.errors import ProviderError
from fleet.ops import destroy
from fleet.ops.loop import Loop
from fleet.providers.base import Box, Provider


def go(fleet: FleetRun, order: destroy.Order,
       spend: destroy.Spend | None = None) -> destroy.Destroyed | None:
    providers = {p: fleet.client(p) for p in ("vast", "runpod")}
    return destroy.destroy(load_config(), fleet.reg, providers, order, spend=spend)


def fleet_label(fleet: FleetRun, role: str = "bench", suffix: str = "0a0a0a") -> str:
    return f"{role}-{fleet.reg.fleet_id()}-vast-{suffix}"


def test_an_orphan_under_a_label_not_of_the_fleets_form_is_never_destroyed(
        fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-by-hand")
    fleet.row("bench-by-hand", status="destroyed")  # a row under it, given up
    with pytest.raises(destroy.Refused, match="not of this fleet's label form"):
        go(fleet, destroy.Order("bench-by-hand", box_id=box.box_id, judged=True))
    assert fleet.client("vast").box(box.box_id) is not None


def test_an_orphan_is_destroyed_only_where_its_provider_lists_it_under_that_label(
        fleet: FleetRun) -> None:
    label = fleet_label(fleet)
    fleet.row(label, status="destroyed")
    other = fleet.land("vast", "someone-elses")
    with pytest.raises(destroy.Refused, match="listed under 'someone-elses'"):
        go(fleet, destroy.Order(label, box_id=other.box_id, judged=True))
    assert fleet.client("vast").box(other.box_id) is not None
    mine = fleet.land("vast", label)
    done = go(fleet, destroy.Order(label, box_id=mine.box_id, judged=True))
    assert done is not None and done.box_ids == [mine.box_id] and done.row is None
    assert fleet.client("vast").box(mine.box_id) is None
    assert fleet.reg.get(label).status == "destroyed"  # type: ignore[union-attr]


def test_a_box_whose_row_is_not_in_the_registry_is_never_destroyed(fleet: FleetRun) -> None:
    box = fleet.land("vast", fleet_label(fleet))
    with pytest.raises(destroy.Refused, match="no box labelled"):
        go(fleet, destroy.Order(fleet_label(fleet), box_id=box.box_id, judged=True))
    assert fleet.client("vast").box(box.box_id) is not None


def test_the_guards_refuse_in_order_before_the_budget_is_asked(fleet: FleetRun) -> None:
    asked: list[str] = []

    def spend(row: Row) -> bool:
        asked.append(row.label)
        return True

    box = fleet.land("vast", "live-x-1")
    fleet.row("live-x-1", role="live", kind="standing", status="running",
              provider_id=box.box_id, job="j1")
    # standing first, then the unread outputs: neither spends the disruption budget
    with pytest.raises(destroy.Refused, match="standing role live"):
        go(fleet, destroy.Order("live-x-1"), spend)
    with pytest.raises(destroy.Refused, match="not read back"):
        go(fleet, destroy.Order("live-x-1", judged=True), spend)
    assert asked == [] and fleet.client("vast").box(box.box_id) is not None
    assert go(fleet, destroy.Order("live-x-1", force=True), spend) is not None
    assert asked == ["live-x-1"] and fleet.client("vast").box(box.box_id) is None


def test_a_row_that_moved_on_since_it_was_judged_is_kept(fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-x-2")
    fleet.row("bench-x-2", status="running", provider_id=box.box_id)
    with pytest.raises(destroy.Refused, match="changed since it was judged"):
        go(fleet, destroy.Order("bench-x-2", seen_id="999999", judged=True))
    assert fleet.client("vast").box(box.box_id) is not None
    assert fleet.reg.get("bench-x-2").live  # type: ignore[union-attr]


def test_a_spent_budget_keeps_the_box_and_its_row(fleet: FleetRun) -> None:
    box = fleet.land("vast", "live-x-3")
    fleet.row("live-x-3", role="live", kind="standing", status="running",
              provider_id=box.box_id)
    before = fleet.registry_bytes()
    assert go(fleet, destroy.Order("live-x-3", judged=True), lambda row: False) is None
    assert fleet.client("vast").box(box.box_id) is not None
    assert fleet.registry_bytes() == before


class StillListed:
    """A provider whose destroy is answered but whose box stays listed."""

    def __init__(self, real: Provider) -> None:
        self.real, self.name = real, real.name

    def destroy(self, box_id: str) -> None:
        pass

    def box(self, box_id: str) -> Box | None:
        return self.real.box(box_id)


def test_a_box_still_listed_after_its_destroy_leaves_its_row_live(fleet: FleetRun) -> None:
    box = fleet.land("vast", "bench-x-4")
    fleet.row("bench-x-4", status="running", provider_id=box.box_id)
    providers = {"vast": StillListed(fleet.client("vast"))}
    with pytest.raises(ProviderError, match="still listed"):
        destroy.destroy(load_config(), fleet.reg, providers,  # type: ignore[arg-type]
                        destroy.Order("bench-x-4"))
    assert fleet.reg.get("bench-x-4").live  # type: ignore[union-attr]


def test_marking_writes_what_the_caller_adds(fleet: FleetRun) -> None:
    box = fleet.land("runpod", "bench-x-5")
    fleet.row("bench-x-5", provider="runpod", status="running", provider_id=box.box_id,
              teardown="destroy failed: earlier")
    done = go(fleet, destroy.Order("bench-x-5", also={"teardown": None, "note": "why"}))
    assert done is not None and done.row is not None
    assert (done.row.status, done.row.teardown, done.row.note) == ("destroyed", None, "why")


def test_a_box_a_rent_wanted_gone_that_went_after_all_is_marked_by_the_loop(
        fleet: FleetRun) -> None:
    """What once went wrong: the client refuses to read "no such box" as destroyed for an id its
    key never saw, so a loop started after the box went failed its destroy every tick and
    the budget counted the row for ever. Gone by id while the listing shows the fleet's
    other boxes, the row is marked."""
    label = f"live-{fleet.reg.fleet_id()}-vast-0d0d0d"
    box = fleet.land("vast", label)
    fleet.row(label, role="live", kind="standing", status="running", provider_id=box.box_id,
              destroy_wanted="over budget at the listed price $9.000/h")
    fleet.client("vast").destroy(box.box_id)  # its terminate went through after all
    # the key provably opens the fleet's account: another of its boxes is listed there
    other = f"live-{fleet.reg.fleet_id()}-vast-0e0e0e"
    mine = fleet.land("vast", other)
    fleet.row(other, role="live", kind="standing", status="running", provider_id=mine.box_id)
    acts: list[str] = []
    loop = Loop(load_config(), {p: fleet.client(p) for p in ("vast", "runpod")},
                echo=acts.append, converge_fn=lambda _c, _l: None,
                check_fn=lambda _c, _b: [])
    for _ in range(2):
        loop.tick()
    assert not fleet.reg.get(label).live, [a for a in acts if label in a]


def test_a_row_without_id_under_a_hand_label_never_takes_a_persons_box(
        fleet: FleetRun) -> None:
    """`fleet rent bench --label web1` whose create's outcome was unknown leaves row web1
    `renting` with no id. The person's own box labelled web1 is destroyed by `fleet destroy
    web1`: the path's step 1 takes "every box under its label" for a row with no id without
    the exact-form rule it applies to any other box under a label (the loop itself never
    adopts or destroys such a box: `_hand_labelled`)."""
    persons = fleet.land("vast", "web1")
    fleet.row("web1", status="renting", note="rent outcome unknown")
    got = fleet("destroy", "web1")
    assert got.code == 2 and "may be a person's" in got.err and "--force" in got.err, got
    assert fleet.client("vast").box(persons.box_id) is not None, got


def _destroy_calls(path: Path) -> list[int]:
    """Lines of `path` that call a provider's `.destroy(...)` (not the one path's module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute) and n.func.attr == "destroy"
            and not (isinstance(n.func.value, ast.Name) and n.func.value.id == "destroy")]


def test_every_destroy_in_the_fleets_code_goes_through_the_one_path() -> None:
    # the path itself, and the provider clients (a destroy is their API call, and a create
    # cleans up the second box it made under one label)
    allowed = {ROOT / "fleet/ops/destroy.py", ROOT / "fleet/boxes/lifecycle.py"}
    allowed |= set((ROOT / "fleet/providers").glob("*.py"))
    found = {str(p.relative_to(ROOT)): lines for p in sorted((ROOT / "fleet").rglob("*.py"))
             if p not in allowed and (lines := _destroy_calls(p))}
    assert found == {}, f"destroys outside fleet.ops.destroy: {found}"


def test_a_row_whose_box_the_key_cannot_see_is_marked_gone_only_on_the_operators_word(
        fleet: FleetRun, monkeypatch: pytest.MonkeyPatch) -> None:
    label = fleet_label(fleet)
    box = fleet.land("vast", label)
    fleet.row(label, status="running", provider_id=box.box_id)
    monkeypatch.setenv("VAST_API_KEY", fleet.sbx.world.add_account("vast"))  # another account
    refused = fleet("destroy", label)
    assert refused.code != 0 and "no such box on this key's account" in refused.err, refused
    assert fleet.reg.get(label).live  # type: ignore[union-attr]
    marked = fleet("destroy", label, "--gone")
    assert marked.code == 0 and f"marked {label} vanished" in marked.out, marked
    row = fleet.reg.get(label)
    assert row is not None and row.status == "vanished" and row.destroyed_at
    assert "console shows no box" in (row.note or "")
    monkeypatch.setenv("VAST_API_KEY", fleet.sbx.env()["VAST_API_KEY"])  # nothing destroyed
    assert fleet.client("vast").box(box.box_id) is not None


def test_a_row_is_never_marked_gone_while_the_key_shows_its_box(fleet: FleetRun) -> None:
    label = fleet_label(fleet)
    box = fleet.land("vast", label)
    fleet.row(label, status="running", provider_id=box.box_id)
    got = fleet("destroy", label, "--gone")
    assert got.code == 2 and f"shows box {box.box_id}" in got.err, got
    assert fleet.reg.get(label).live  # type: ignore[union-attr]


def test_unread_outputs_are_marked_gone_only_with_force(fleet: FleetRun,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    label = fleet_label(fleet)
    box = fleet.land("vast", label)
    fleet.row(label, status="running", provider_id=box.box_id, job="cold")
    monkeypatch.setenv("VAST_API_KEY", fleet.sbx.world.add_account("vast"))
    got = fleet("destroy", label, "--gone")
    assert got.code == 2 and "outputs were not read back" in got.err, got
    assert fleet("destroy", label, "--gone", "--force").code == 0
    assert fleet.reg.get(label).status == "vanished"  # type: ignore[union-attr]


def test_a_rent_not_finished_is_never_marked_gone(fleet: FleetRun) -> None:
    """A rent still in flight (its row `renting`, no box id) shows nothing under its label
    yet: marked gone, the box its create then lands would bill with no live row to own it."""
    fleet.row("web1", role="live", kind="standing", status="renting")
    got = fleet("destroy", "web1", "--gone")
    assert got.code == 2 and "not finished" in got.err, got
    assert fleet.reg.get("web1").live  # type: ignore[union-attr]
