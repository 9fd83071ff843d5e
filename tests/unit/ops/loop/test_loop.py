"""The loop's decisions, against an in-memory provider and given check verdicts: two dead
checks in a row (never an API error) before a replacement, what is owed and why, orphans and
their grace, the -r<n> labels. The sandbox tests (tests/integration/test_loop_sandbox.py) run
the same loop against real boxes, the real deploy and the real checks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import loop_fixture
import pytest
from loop_fixture import TOML, FakeVast, make, standing_box
from state_fixture import sql

from fleet.core.boxes import Row
from fleet.core.errors import FleetError, ProviderError
from fleet.core.verdicts import Health, Owed
from fleet.ops.loop import Loop
from fleet.providers.base import Box, Offer, RentRequest
from fleet.state.loop_memory import Memory


def test_two_dead_checks_in_a_row_replace_a_box_and_one_alive_check_resets(
        tmp_path: Path) -> None:
    loop, vast, ssh = make(tmp_path)
    row = standing_box(loop, vast)
    ssh += [False, True, False]
    for _ in range(3):  # dead, alive, dead: never two in a row
        loop.tick()
    assert loop.reg.get(row.label).live and vast.destroyed == []  # type: ignore[union-attr]
    ssh += [False]
    t = loop.tick()
    assert vast.destroyed == ["1"] and loop.reg.get(row.label).status == "destroyed"  # type: ignore[union-attr]
    # no market for the card: the re-rent is owed, with the reason
    assert [(o.rerent_of, o.reason) for o in t.owed] == [
        (row.label, "no capacity: no RTX 4090 x1 offered")]
    page = json.loads((tmp_path / "page" / "fleet.json").read_text())
    assert page["owed"][0]["reason"].startswith("no capacity")
    # the re-rent stands in for the roster's box: owed once, not twice
    assert len(loop.tick().owed) == 1


def test_a_provider_that_fails_is_never_a_death(tmp_path: Path) -> None:
    loop, vast, ssh = make(tmp_path)
    row = standing_box(loop, vast)
    vast.failing = True
    for _ in range(4):
        t = loop.tick()
        assert t.provider_errors and not t.dead and not t.replaced
    assert vast.destroyed == [] and loop.reg.get(row.label).live  # type: ignore[union-attr]
    vast.failing = False
    assert loop.tick().well == [row.label]


def test_a_box_the_provider_stopped_listing_is_marked_vanished_and_owed(tmp_path: Path) -> None:
    loop, vast, ssh = make(tmp_path)
    row = standing_box(loop, vast)
    vast.listed.clear()
    ssh += [False, False]  # "no such box" is a death only with SSH failing too
    assert loop.tick().dead == {row.label: "vast has no box 1 any more (asked by id), and SSH "
                                           "does not answer"}
    t = loop.tick()
    assert loop.reg.get(row.label).status == "vanished" and vast.destroyed == []  # type: ignore[union-attr]
    assert [o.rerent_of for o in t.owed] == [row.label]


def test_why_a_box_is_owed(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path, budget=0.01)
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="595.71.05")]
    t = loop.tick()  # listed, but not on the pinned driver
    assert t.owed[0].reason.startswith("no admissible offer: 1 listed, none with driver "
                                       "580.95.05"), t.owed
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05")]
    t = loop.tick()  # admissible, but the day would pass the budget: nothing rented
    assert t.owed[0].reason.startswith("over budget: renting a RTX 4090 on vast"), t.owed
    assert "would pass the daily budget $0.01" in t.owed[0].reason
    assert loop.reg.rows() == []
    vast.failing = True
    vast.market = []
    assert loop.tick().owed[0].reason.startswith("no capacity")


def test_orphans_are_destroyed_after_their_grace_and_foreign_boxes_never(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path, grace=3600)
    standing_box(loop, vast)
    ours = f"live-{loop.reg.fleet_id()}-vast-0b0b0b"
    # a rent the fleet gave up (its create's outcome unknown), whose box landed after all
    loop.reg.add(Row(label=ours, provider="vast", role="live", kind="standing",
                     card="RTX 3090", gpu_count=1, usd_per_hour=0.2))
    loop.reg.mark_destroyed(ours, "vanished")
    vast.listed["7"] = Box("vast", "7", ours, "RTX 3090", 1, 0.2, "running")
    vast.listed["8"] = Box("vast", "8", "someone-elses-box", "RTX 3090", 1, 0.2, "running")
    t = loop.tick()
    assert t.orphans == [f"{ours} (vast/7)"] and vast.destroyed == []
    mem = Memory.load(loop.cfg.registry)  # an hour passes
    mem.orphans["vast/7"] = "2000-01-01T00:00:00Z"
    mem.save(loop.cfg.registry)
    t = loop.tick()
    assert vast.destroyed == ["7"] and "8" in vast.listed
    assert not Memory.load(loop.cfg.registry).orphans


def test_an_unreadable_listing_row_is_never_dead_destroyed_or_swept(tmp_path: Path) -> None:
    from fleet.ops.budget import project
    from fleet.providers.base import Unreadable

    loop, vast, ssh = make(tmp_path, grace=120)
    odd = standing_box(loop, vast)
    standing_box(loop, vast, "live-vast-bbbbbb", box_id="2")
    del vast.listed["1"]
    vast.odd["1"] = Unreadable("vast", "1", odd.label, "KeyError: 'HostPort'")
    ours = f"live-{loop.reg.fleet_id()}-vast-0b0b0b"  # no row names it: an orphan, if read
    vast.odd["7"] = Unreadable("vast", "7", ours, "KeyError: 'HostPort'")
    for _ in range(4):
        mem = Memory.load(loop.cfg.registry)  # past any grace
        mem.orphans = {k: "2000-01-01T00:00:00Z" for k in ("vast/1", "vast/7")}
        mem.save(loop.cfg.registry)
        t = loop.tick()
        assert t.well == ["live-vast-bbbbbb"] and not t.dead and not t.orphans, t
        said = [a for a in t.actions if "unreadable" in a]
        assert any(odd.label in a and "vast/1" in a and "HostPort" in a for a in said), said
        assert any(ours in a and "vast/7" in a for a in said), said
    assert vast.destroyed == [] and not t.owed
    rows = loop.reg.rows()
    assert all(r.live for r in rows)
    assert project(rows, 100).rate_usd == pytest.approx(2 * 0.3 * 24)  # still counted


def test_rerent_labels_count_up_from_the_first_box(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    first = f"live-{loop.reg.fleet_id()}-vast-aaaaaa"
    standing_box(loop, vast, first)
    owe = Owed("live", "vast", "RTX 4090", 1, "2026-01-01T00:00:00Z", rerent_of=first)
    assert loop._label(owe) == f"{first}-r1"
    loop.reg.add(Row(label=f"{first}-r1", provider="vast", role="live", kind="standing",
                     card="RTX 4090", gpu_count=1, usd_per_hour=0.3))
    owe.rerent_of = f"{first}-r1"
    assert loop._label(owe) == f"{first}-r2"


@pytest.mark.parametrize("doc", ["{not json", "[]", '{"tick": "x"}'])
def test_an_unreadable_memory_is_one_clear_error_and_is_kept(tmp_path: Path, doc: str) -> None:
    reg = tmp_path / "boxes.json"
    Memory(tick=3).save(reg)
    sql(reg, "UPDATE docs SET doc = ? WHERE name = 'loop'", (doc,))
    with pytest.raises(FleetError, match="the loop's memory is not readable"):
        Memory.load(reg)
    assert sql(reg, "SELECT doc FROM docs WHERE name = 'loop'") == [(doc,)]  # never reset


def test_a_rerent_keeps_the_dead_boxs_cloud_tier(tmp_path: Path) -> None:
    loop, vast, ssh = make(tmp_path)
    row = standing_box(loop, vast)
    loop.reg.update(row.label, cloud="datacenter")
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05",
                         cloud="community")]
    ssh += [False, False]
    loop.tick()
    t = loop.tick()
    assert [(o.rerent_of, o.cloud) for o in t.owed] == [(row.label, "datacenter")]
    assert t.owed[0].reason == "no capacity: no RTX 4090 x1 offered on the datacenter tier"


def test_a_page_that_cannot_be_written_does_not_stop_the_tick(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = standing_box(loop, vast)
    (tmp_path / "page").write_text("a file where the folder was\n")
    t = loop.tick()
    assert t.well == [row.label] and any(a.startswith("page: not written") for a in t.actions)


def test_a_box_whose_agent_refuses_admission_is_unfit_and_replaced(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = standing_box(loop, vast)
    why = "driver 575.64.03 is not the admitted 580.95.05"

    def refused(_cfg: Any, built: Any) -> list[Health]:
        return [Health(label, "vast", ssh=True, agent=True, admitted=False, admission_reason=why,
                       problems=[f"admission refused: {why}"])
                for label, _ in built.groups["standing"]]

    loop.check_fn = refused
    lines: list[str] = []
    loop.echo = lines.append
    t = loop.tick()
    assert t.dead == {row.label: f"unfit: its agent refused admission ({why})"}
    assert vast.destroyed == [] and f"{row.label}: unfit (its agent refused admission ({why})), " \
        "check 1 of 2" in lines
    vast.listed["1"].machine_id = "m1"
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05", machine_id="m1")]
    t = loop.tick()
    assert vast.destroyed == ["1"] and loop.reg.get(row.label).status == "destroyed"  # type: ignore[union-attr]
    # its machine is passed over: the only offer is on it, so the re-rent is owed
    assert [o.reason for o in t.owed] == [
        "no admissible offer: the 1 offered are on machines where a box was found unfit"]
    assert Memory.load(loop.cfg.registry).unfit_machines.keys() == {"vast/m1"}


def test_a_box_whose_admission_is_unknown_is_never_unfit(tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    standing_box(loop, vast)
    loop.check_fn = lambda _c, built: [Health(label, "vast", ssh=True, agent=False,
                                              problems=["agent: down"])
                                       for label, _ in built.groups["standing"]]
    loop.converge_fn = lambda _c, labels: None
    for _ in range(3):
        assert loop.tick().dead == {}
    assert vast.destroyed == []


def test_the_loop_notes_when_a_box_was_listed_stopped_and_forgets_it_when_it_runs(
        tmp_path: Path) -> None:
    loop, vast, _ = make(tmp_path)
    row = standing_box(loop, vast)
    vast.listed["1"].status = "exited"
    loop.tick()
    stopped_at = loop.reg.get(row.label).stopped_at  # type: ignore[union-attr]
    assert stopped_at is not None
    loop.converge_fn = lambda _c, labels: None
    vast.listed["1"].status = "running"
    loop.tick()
    assert loop.reg.get(row.label).stopped_at is None  # type: ignore[union-attr]


class Renting(FakeVast):
    """A provider that rents from its market and counts how often its account is listed."""

    def __init__(self, name: str, failing: bool = False) -> None:
        super().__init__()
        self.name, self.failing, self.listings = name, failing, 0

    def boxes(self) -> list[Any]:
        self.listings += 1
        return super().boxes()

    def rent(self, offer: Offer, req: RentRequest) -> Box:
        box = Box(self.name, str(100 + len(self.listed)), req.label, offer.card, 1,
                  offer.usd_per_hour, "provisioning")
        self.listed[box.box_id] = box
        return box


def renting_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
                 ) -> tuple[Loop, Renting, Renting]:
    wants = TOML.replace('card = "RTX 4090"\n', f'card = "RTX 4090"\ncount = {count}\n')
    monkeypatch.setattr(loop_fixture, "TOML", wants)  # what `make` reads
    monkeypatch.setattr("fleet.ops.rent.wait_ready", lambda *_a, **_k: {})
    loop, _, _ = make(tmp_path, budget=1000)
    vast, runpod = Renting("vast"), Renting("runpod")
    vast.market = [Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05")]
    loop.providers = {"vast": vast, "runpod": runpod}
    return loop, vast, runpod


def test_a_tick_lists_the_account_for_the_budget_once_however_many_it_rents(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, runpod = renting_loop(tmp_path, monkeypatch, count=3)
    loop.tick()
    assert len(loop.reg.live_rows()) == 3
    assert (vast.listings, runpod.listings) == (2, 2)  # the tick's view, then the budget's


def test_a_listing_that_failed_for_the_budget_refuses_the_ticks_rents_without_asking_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loop, vast, runpod = renting_loop(tmp_path, monkeypatch, count=3)
    calls = {"n": 0}
    seen = runpod.boxes

    def fails_after_the_view() -> list[Any]:  # a 429 from the budget's listing on
        calls["n"] += 1
        if calls["n"] > 1:
            raise ProviderError("runpod", "list", "HTTP 429")
        return seen()

    runpod.boxes = fails_after_the_view  # type: ignore[method-assign]
    t = loop.tick()
    assert loop.reg.live_rows() == [] and calls["n"] == 2, calls
    assert [o.reason.startswith("over budget") and "429" in o.reason for o in t.owed] == \
        [True] * 3


def test_a_machine_whose_box_exits_before_it_is_ready_is_not_rented_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its container does not start there (a bad host): each tick rented it again, and paid
    for every start, until the machine is passed over like an unfit one."""
    loop, vast, _ = renting_loop(tmp_path, monkeypatch, count=1)
    bad = Offer("vast", "9", "RTX 4090", 1, 0.2, driver="580.95.05", machine_id="m-bad")
    good = Offer("vast", "8", "RTX 4090", 1, 0.3, driver="580.95.05", machine_id="m-good")
    vast.market = [bad, good]
    rented: list[str | None] = []
    real = vast.rent

    def rent(offer: Offer, req: RentRequest) -> Box:
        rented.append(offer.machine_id)
        box = real(offer, req)
        if offer.machine_id == "m-bad":  # its container fails to start
            box.status, box.machine_id = "exited", "m-bad"
        return box

    vast.rent = rent  # type: ignore[method-assign]
    for _ in range(3):
        loop.tick()
    assert rented == ["m-bad", "m-good"], rented  # not m-bad, m-bad, m-bad
    assert "vast/m-bad" in Memory.load(loop.cfg.registry).unfit_machines


def test_a_rerent_is_never_owed_past_the_roster(tmp_path: Path) -> None:
    """Found by the simulation: a registry restored twice from older copies had a box adopted
    for the roster's place and still owed the re-rent of a dead box in the same shape: five
    boxes for a roster of four. A re-rent is owed only while its roster entry is short."""
    loop, vast, _ = make(tmp_path)  # the roster: one RTX 4090 on vast
    standing_box(loop, vast, "live-vast-aaaaaa")
    mem = Memory.load(loop.cfg.registry)
    mem.rerents = [Owed("live", "vast", "RTX 4090", 1, "2026-01-01T00:00:00Z",
                       rerent_of="live-vast-dddddd")]
    assert loop.owed(mem) == []
    assert mem.rerents == []
    loop.reg.mark_destroyed("live-vast-aaaaaa")
    mem.rerents = [Owed("live", "vast", "RTX 4090", 1, "2026-01-01T00:00:00Z",
                       rerent_of="live-vast-aaaaaa")]
    assert [o.rerent_of for o in loop.owed(mem)] == ["live-vast-aaaaaa"]  # short: owed
