"""The loop's faults on real sandbox boxes: the fleet's key switched to an empty account, one
provider's SSH path cut, and two hung sshds at once (each a death; one box replaced, the other
kept by the disruption budget), then deaths the provider itself reports.

One sandbox serves the module; the roster wants two standing RTX 4090 boxes per provider.
Every test starts from a settled fleet, ticked with `fleet loop --once` (interval 10,
dead_checks 2).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_cli import wait_for
from loopy import LOOP, Loopy, sandboxed

from fleet.core.boxes import Row
from sandbox import fleet_toml

ROSTER = fleet_toml.ROSTER_4090
BOXES = sum(n for _, _, n in ROSTER)
TICKS = int(LOOP["dead_checks"]) + 2  # past the point where a counted death would destroy


def config(state: Path) -> str:
    return fleet_toml.render(state, loop=LOOP, roster=ROSTER)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loopy]:
    yield from sandboxed(tmp_path_factory, "faults", config, boxes=BOXES)


@pytest.fixture(autouse=True)
def no_faults(fleet: Loopy) -> Iterator[None]:
    yield from fleet.without_faults()


def box_id(row: Row) -> str:
    """The sandbox's name for the row's box: provider and provider id."""
    return f"{row.provider}-{row.provider_id}"


def labels(rows: list[Row]) -> list[str]:
    return sorted(r.label for r in rows)


def said(t: dict[str, Any], *parts: str) -> bool:
    """Whether one of the tick's actions says every one of `parts`."""
    return any(all(p in a for p in parts) for a in t["actions"])


def quiet(t: dict[str, Any]) -> bool:
    """Nothing destroyed and nothing rented this tick."""
    return not [a for a in t["actions"] if ": rented " in a or ": destroyed" in a
                or "marked vanished" in a] and not t["replaced"]


def test_the_key_switched_to_an_empty_account_destroys_and_rents_nothing(fleet: Loopy) -> None:
    rows = fleet.settle()
    vast = [r for r in rows if r.provider == "vast"]
    own = fleet.env["VAST_API_KEY"]
    with fleet.control() as c:
        fleet.env["VAST_API_KEY"] = c.add_account("vast")
    try:
        for _ in range(TICKS):
            t = fleet.tick()
            assert quiet(t) and t["dead"] == {} and t["owed"] == [], t
            assert sorted(t["well"]) == labels(rows), t
            assert said(t, "breaker vast", "2 left out of its listing"), t
            for r in vast:
                assert said(t, f"{r.label}: vast has no box {r.provider_id} (asked by id), "
                               "but it answers SSH: kept"), t
    finally:
        fleet.env["VAST_API_KEY"] = own
    t = fleet.tick()
    assert quiet(t) and sorted(t["well"]) == labels(rows) and not said(t, "breaker"), t
    assert labels(fleet.live()) == labels(rows)


def test_one_providers_ssh_path_cut_opens_its_breaker_and_costs_no_box(fleet: Loopy) -> None:
    rows = fleet.settle()
    vast = [r.label for r in rows if r.provider == "vast"]
    with fleet.control() as c:
        c.fault("ssh_path_cut", "runpod")
        c.settle()
    try:
        for _ in range(TICKS):
            t = fleet.tick()
            assert quiet(t) and t["dead"] == {} and t["owed"] == [], t
            assert said(t, "breaker runpod", "2 not answering SSH"), t
            assert sorted(t["well"]) == sorted(vast), t
    finally:
        with fleet.control() as c:
            c.fault("ssh_path_restore", "runpod")
            c.settle()
    t = fleet.tick()
    assert quiet(t) and sorted(t["well"]) == labels(rows), t
    assert labels(fleet.live()) == labels(rows)


def test_the_disruption_budget_keeps_the_second_hung_box_but_never_a_reported_death(
        fleet: Loopy) -> None:
    rows = fleet.settle()
    fleet.window_passed()
    hung = [next(r for r in rows if r.provider == p) for p in ("vast", "runpod")]
    with fleet.control() as c:
        for r in hung:
            c.fault("sshd_hang", box_id(r))
        c.settle()
    first = wait_for("one of the hung boxes replaced",
                     lambda: (t := fleet.tick()) and t["replaced"] and t, timeout=600, poll_s=0)
    assert len(first["replaced"]) == 1, first
    gone = next(r for r in hung if r.label in first["replaced"])
    kept = next(r for r in hung if r is not gone)
    # a hung sshd is a death, said with why, and its box is destroyed at its provider
    assert all("did not start within" in first["dead"].get(r.label, "") for r in hung), first
    assert said(first, f"{gone.label}: destroyed (dead or unfit on 2 checks)"), first
    with fleet.control() as c:
        assert {i["phase"] for i in c.instances() if i["box_id"] == box_id(gone)} == \
            {"destroyed"}
    held = (f"{kept.label}: disruption budget spent: 1 destroyed in the last hour (role live "
            f"may lose 1 of 4); {kept.label} kept")
    assert said(first, held), first
    for _ in range(2):  # every tick after says so, and destroys nothing
        t = fleet.tick()
        assert kept.label in t["dead"] and said(t, held), t
        assert not said(t, ": destroyed") and kept.label not in t["replaced"], t
    with fleet.control() as c:
        assert [i["phase"] for i in c.instances() if i["box_id"] == box_id(kept)] == \
            ["running"]
    # deaths the provider reports (its listing says exited or stopped) are never held: the
    # kept box, and a well one of the other provider
    well = next(r for r in rows if r.provider == gone.provider and r is not gone)
    with fleet.control() as c:
        for r in (kept, well):
            c.fault("preempt", box_id(r))
        c.settle()
    ticks: list[dict[str, Any]] = []

    def both_replaced() -> bool:
        ticks.append(fleet.tick())
        return {kept.label, well.label} <= {old for t in ticks for old in t["replaced"]}

    wait_for("the reported deaths replaced", both_replaced, timeout=600, poll_s=0)
    assert not [t for t in ticks if said(t, "disruption budget spent")], ticks
    replaced = {k: v for t in (first, *ticks) for k, v in t["replaced"].items()}
    after = fleet.settle()
    assert labels(after) == sorted({*labels(rows), *replaced.values()} - set(replaced))
