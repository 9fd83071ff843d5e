"""Port moves end on evidence only: a stale or unknown reading of the box being replaced never
gives its move up, and a box whose moves all ended is tried again after a cool-down (the
in-process sandbox of test_ports.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from test_ports import peers_settled, porting_loop, portless_market, replacing, standing
from test_spread import rent_standing, wait_running

from fleet.core.errors import ProviderError
from fleet.core.times import iso
from fleet.core.verdicts import Health
from fleet.ops import loop as loop_mod
from sandbox.control_client import ControlClient
from sandbox.daemon import Sandbox


def test_a_stale_reading_of_the_old_box_never_gives_its_port_move_up(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    old = rent_standing(lp.cfg, lp.reg, "live-s-oooooo")
    mate = rent_standing(lp.cfg, lp.reg, "live-s-mmmmmm")
    wait_running(sbx)
    standing(lp, old, mate)
    # its mapping is listed, and none of its mates dials it: owed a port
    verdicts[old.label] = Health(old.label, "vast", ssh=True, agent=True, synced=True,
                                 peers_in=0, star_only=True, problems=["node: star-only"])
    lp.tick()
    peers_settled(lp)
    t = lp.tick()
    new = next((r for r in lp.reg.rows() if r.move_of == old.label), None)
    assert new is not None, t.actions
    wait_running(sbx)
    lp.reg.update(new.label, standing=True)
    verdicts[new.label] = Health(new.label, "vast", ssh=True, agent=True, synced=False,
                                 peers_in=0, problems=["node: syncing"])  # not done yet
    # the old box's agent has not written its status for minutes: nothing is known of its
    # mesh, so nothing says it owes no port
    verdicts[old.label] = Health(old.label, "vast", ssh=True, agent=True,
                                 problems=["agent: status not written for 300 s"])
    t = lp.tick()
    assert lp.reg.get(new.label).live, t.actions  # type: ignore[union-attr]
    assert not any("owes no port any more" in a for a in t.actions), t.actions
    assert lp.reg.get(old.label).live  # type: ignore[union-attr]


def test_a_box_whose_port_moves_all_ended_is_tried_again_after_the_cool_down(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    lp = porting_loop(tmp_path, monkeypatch, {})
    machines = portless_market(sbx, lp.cfg)
    old = rent_standing(lp.cfg, lp.reg, "live-c-oooooo")
    wait_running(sbx)
    standing(lp, old)
    ended = iso_ago(loop_mod.MOVE_COOLDOWN_S - 600)
    for i in range(loop_mod.MOVE_TRIES):  # three port moves that ended without one
        lp.reg.add(replace(old, label=f"{old.label}-r{i + 1}", provider_id=f"gone{i}",
                           status="destroyed", destroyed_at=ended, move_of=old.label,
                           move_for="port", place=None, note="move given up"))
    with ControlClient(sbx.control.url) as c:
        c.shape_machine("vast", machines[-1]["machine_id"], direct_port_count=100)
    t = lp.tick()
    assert not [r for r in lp.reg.rows() if r.move_of == old.label and r.live], t.actions
    assert any("3 replacements ended without one" in a and "tried again in" in a
               for a in t.actions), t.actions
    for r in lp.reg.rows():  # the cool-down passes
        if r.move_of == old.label:
            lp.reg.update(r.label, destroyed_at=iso_ago(loop_mod.MOVE_COOLDOWN_S + 600))
    t = lp.tick()
    movers = [r for r in lp.reg.rows() if r.move_of == old.label and r.live]
    assert movers, ("never tried again after its moves ended", t.actions)


def iso_ago(seconds: float) -> str:
    from datetime import UTC, datetime, timedelta
    return iso(datetime.now(UTC) - timedelta(seconds=seconds))


def test_the_old_box_is_kept_while_the_listing_fails_or_the_reading_is_stale(
        sbx: Sandbox, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    verdicts: dict[str, Health] = {}
    lp = porting_loop(tmp_path, monkeypatch, verdicts)
    old, new = replacing(sbx, lp, "live-h-oooooo")
    # a stale reading: peers unknown, not synced known
    verdicts[new.label] = Health(new.label, "vast", ssh=True, agent=True, synced=None,
                                 peers_in=None, problems=["node: reading is 900 s old"])
    lp.tick()
    assert lp.reg.get(old.label).live  # type: ignore[union-attr]
    verdicts.pop(new.label)
    vast = lp.providers["vast"]
    real = vast.boxes

    def failing() -> Any:
        raise ProviderError("vast", "list", "HTTP 500")

    vast.boxes = failing  # type: ignore[method-assign]
    t = lp.tick()
    assert lp.reg.get(old.label).live, t.actions  # type: ignore[union-attr]
    assert [r.label for r in lp.reg.rows() if r.move_of == old.label] == [new.label]
    vast.boxes = real  # type: ignore[method-assign]
    t = lp.tick()
    assert not lp.reg.get(old.label).live, t.actions  # type: ignore[union-attr]
